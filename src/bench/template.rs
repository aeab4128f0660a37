//! Descriptor templates: `--descriptor 'customer={key}'` becomes the entry
//! `customer = <drawn key>` of every check.

use std::str::FromStr;

/// The placeholder replaced by the drawn key, in entry keys and values.
pub const PLACEHOLDER: &str = "{key}";

/// Text with `{key}` placeholders, split once so expanding is a plain join.
#[derive(Debug, Clone, PartialEq)]
struct Pattern {
    /// Literal pieces around the placeholders: `n` placeholders give `n + 1` pieces.
    pieces: Vec<String>,
}

impl Pattern {
    fn new(text: &str) -> Pattern {
        Pattern {
            pieces: text.split(PLACEHOLDER).map(str::to_owned).collect(),
        }
    }

    fn expand(&self, key: &str) -> String {
        self.pieces.join(key)
    }
}

/// One `KEY=VALUE` flag.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryTemplate {
    key: Pattern,
    value: Pattern,
}

impl FromStr for EntryTemplate {
    type Err = String;

    fn from_str(text: &str) -> Result<EntryTemplate, String> {
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=VALUE (e.g. customer={{key}}), got `{text}`"))?;
        if key.is_empty() {
            return Err(format!("empty descriptor key in `{text}`"));
        }
        Ok(EntryTemplate {
            key: Pattern::new(key),
            value: Pattern::new(value),
        })
    }
}

/// All `--descriptor` flags, in order: the entries of one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorTemplate {
    entries: Vec<EntryTemplate>,
}

impl DescriptorTemplate {
    pub fn new(entries: Vec<EntryTemplate>) -> Option<DescriptorTemplate> {
        (!entries.is_empty()).then_some(DescriptorTemplate { entries })
    }

    /// The descriptor's `(key, value)` entries for one drawn key.
    pub fn expand(&self, key: &str) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|e| (e.key.expand(key), e.value.expand(key)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(flags: &[&str]) -> DescriptorTemplate {
        DescriptorTemplate::new(flags.iter().map(|f| f.parse().unwrap()).collect()).unwrap()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn replaces_the_placeholder_in_every_entry() {
        let t = template(&["customer={key}", "path=/api/v1", "tenant=t-{key}-{key}"]);
        assert_eq!(
            t.expand("42"),
            pairs(&[
                ("customer", "42"),
                ("path", "/api/v1"),
                ("tenant", "t-42-42")
            ])
        );
    }

    #[test]
    fn placeholder_may_sit_in_the_key_and_value_may_hold_equals() {
        let t = template(&["k{key}=a=b"]);
        assert_eq!(t.expand("7"), pairs(&[("k7", "a=b")]));
    }

    #[test]
    fn empty_value_is_kept() {
        assert_eq!(
            template(&["generic_key="]).expand("1"),
            pairs(&[("generic_key", "")])
        );
    }

    #[test]
    fn rejects_entries_without_key_or_equals() {
        assert!("customer".parse::<EntryTemplate>().is_err());
        assert!("={key}".parse::<EntryTemplate>().is_err());
        assert!(DescriptorTemplate::new(vec![]).is_none());
    }
}
