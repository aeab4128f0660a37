//! Overrides in bulk, as a billing system exchanges them: JSON (an array of
//! rows) or CSV (a header line, then one row a line). One row is one
//! override as asked for ([`Row`]); an import is applied in one commit, all
//! or nothing, so one bad row is reported with its number and changes
//! nothing.

use serde::{Deserialize, Serialize};

use super::{MAX_OVERRIDES, Override, Proposed};
use crate::rules::parse_duration;

/// One override as a row of an import or an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// The descriptor's domain.
    pub domain: String,
    /// The descriptor's entries as `KEY=VALUE`, outermost first; in CSV one
    /// column with the entries separated by `;` (a value holding `;` needs
    /// JSON).
    #[serde(default, deserialize_with = "entries_field")]
    pub descriptor: Vec<String>,
    /// The rule it must resolve to (empty: whichever); with `key`, the rule
    /// (its name or id) a check by rule name addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The key as a check by rule name gives it, instead of a descriptor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Requests per the rule's period.
    pub limit: u64,
    /// A bucket's burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// When it lapses (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_unix_ms: Option<i64>,
    /// Or how long from now it lasts (`30d`, `12h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Why.
    #[serde(default)]
    pub reason: String,
    /// Who set it (exports only; ignored on import).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
    /// When it was set (exports only; ignored on import).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_at_unix_ms: Option<i64>,
}

/// A row that cannot be read, by its number (1 = the first row after a
/// CSV header, or the first element of a JSON array).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("row {row}: {field}: {reason}")]
pub struct BulkError {
    /// 1-based.
    pub row: usize,
    /// The field at fault (`""`: the row or the document).
    pub field: String,
    /// Why.
    pub reason: String,
}

/// `descriptor` as a JSON array of `KEY=VALUE` or, in CSV, one string.
fn entries_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Either::deserialize(d)? {
        Either::One(s) => s
            .split(';')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        Either::Many(v) => v,
    })
}

/// `KEY=VALUE` entries split at their first `=`.
pub fn split_entries(entries: &[String]) -> Result<Vec<(String, String)>, String> {
    entries
        .iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(format!("{e:?} is not KEY=VALUE")),
        })
        .collect()
}

impl Row {
    /// The override this row asks for, with a `ttl` made absolute at `now`.
    pub fn proposed(&self, now_unix_ms: i64) -> Result<Proposed, (String, String)> {
        let entries = split_entries(&self.descriptor).map_err(|e| ("descriptor".into(), e))?;
        let expires_at_unix_ms = match (&self.ttl, self.expires_at_unix_ms) {
            (Some(_), Some(_)) => {
                return Err((
                    "ttl".into(),
                    "give ttl or expires_at_unix_ms, not both".into(),
                ));
            }
            (Some(ttl), None) => {
                let d = parse_duration(ttl).map_err(|e| ("ttl".to_owned(), e))?;
                Some(now_unix_ms.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
            }
            (None, at) => at,
        };
        Ok(Proposed {
            domain: self.domain.clone(),
            entries,
            rule: self.rule.clone().filter(|r| !r.is_empty()),
            key: self.key.clone().filter(|k| !k.is_empty()),
            limit: self.limit,
            burst: self.burst,
            expires_at_unix_ms,
            reason: self.reason.clone(),
        })
    }

    /// The row an override exports as.
    pub fn of(o: &Override) -> Row {
        Row {
            domain: o.domain.clone(),
            descriptor: o.entries.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            rule: Some(if o.entries.is_empty() {
                o.rule_name.clone().unwrap_or_else(|| o.rule.clone())
            } else {
                o.rule.clone()
            }),
            // Set by rule name: no descriptor, the key as checks give it.
            key: o.entries.is_empty().then(|| o.key.clone()),
            limit: o.limit,
            burst: o.burst,
            expires_at_unix_ms: o.expires_at_unix_ms,
            ttl: None,
            reason: o.reason.clone(),
            set_by: Some(o.set_by.clone()),
            set_at_unix_ms: Some(o.set_at_unix_ms),
        }
    }
}

fn too_many(rows: usize) -> BulkError {
    BulkError {
        row: MAX_OVERRIDES + 1,
        field: String::new(),
        reason: format!("{rows} rows or more, over the bound of {MAX_OVERRIDES} overrides"),
    }
}

/// Rows from a JSON array.
pub fn parse_json(text: &[u8]) -> Result<Vec<Row>, BulkError> {
    let values: Vec<serde_json::Value> = serde_json::from_slice(text).map_err(|e| BulkError {
        row: 0,
        field: String::new(),
        reason: format!("not a JSON array of rows: {e}"),
    })?;
    if values.len() > MAX_OVERRIDES {
        return Err(too_many(values.len()));
    }
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value(v).map_err(|e| BulkError {
                row: i + 1,
                field: String::new(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// Rows from CSV with a header line naming the columns (any order; the
/// fields of [`Row`]; `domain`, `limit` and a `descriptor` or a `rule`
/// and `key` required).
pub fn parse_csv(text: &[u8]) -> Result<Vec<Row>, BulkError> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text);
    let mut rows = Vec::new();
    for (i, record) in reader.deserialize::<CsvRow>().enumerate() {
        if rows.len() >= MAX_OVERRIDES {
            return Err(too_many(rows.len() + 1));
        }
        let record = record.map_err(|e| BulkError {
            row: i + 1,
            field: String::new(),
            reason: e.to_string(),
        })?;
        rows.push(record.into());
    }
    Ok(rows)
}

/// A CSV row: every optional column may be present and empty.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CsvRow {
    domain: String,
    #[serde(default)]
    descriptor: String,
    #[serde(default)]
    rule: Option<String>,
    #[serde(default)]
    key: Option<String>,
    limit: u64,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    expires_at_unix_ms: Option<i64>,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    set_by: Option<String>,
    #[serde(default)]
    set_at_unix_ms: Option<i64>,
}

impl From<CsvRow> for Row {
    fn from(r: CsvRow) -> Row {
        let some = |s: Option<String>| s.filter(|s| !s.is_empty());
        Row {
            domain: r.domain,
            descriptor: r
                .descriptor
                .split(';')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect(),
            rule: some(r.rule),
            key: some(r.key),
            limit: r.limit,
            burst: r.burst,
            expires_at_unix_ms: r.expires_at_unix_ms,
            ttl: some(r.ttl),
            reason: r.reason,
            set_by: some(r.set_by),
            set_at_unix_ms: r.set_at_unix_ms,
        }
    }
}

/// Overrides as CSV, with a header line; reads back with [`parse_csv`].
pub fn to_csv<'a>(overrides: impl IntoIterator<Item = &'a Override>) -> String {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let header = [
        "domain",
        "descriptor",
        "rule",
        "key",
        "limit",
        "burst",
        "expires_at_unix_ms",
        "reason",
        "set_by",
        "set_at_unix_ms",
    ];
    // Writing to memory cannot fail; a failed record would only be missing.
    let _ = writer.write_record(header);
    for o in overrides {
        let row = Row::of(o);
        let _ = writer.write_record([
            row.domain,
            row.descriptor.join(";"),
            row.rule.unwrap_or_default(),
            row.key.unwrap_or_default(),
            row.limit.to_string(),
            row.burst.map(|b| b.to_string()).unwrap_or_default(),
            row.expires_at_unix_ms
                .map(|t| t.to_string())
                .unwrap_or_default(),
            row.reason,
            row.set_by.unwrap_or_default(),
            row.set_at_unix_ms
                .map(|t| t.to_string())
                .unwrap_or_default(),
        ]);
    }
    String::from_utf8(writer.into_inner().unwrap_or_default()).unwrap_or_default()
}
