//! Fuzz-style property tests for the parts of `rules` that read untrusted
//! input: rule YAML (random text and byte edits of a valid file) and
//! descriptors from the network resolved to storage keys. Each: no panic,
//! and every error says where (file, line, field) or which field.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::store::key::key_prefix;

const VALID: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
    descriptors:
      - key: path
        value: /v1/*
        algorithm: token_bucket
        burst: 5
        rate_limit:
          unit: second
          requests_per_unit: 2
          name: per_path
  - key: user
    value: vip
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: ip
    scope: global
    partition: strict
    fallback: 0.25
    accuracy: exact
    rate_limit:
      unit: day
      requests_per_unit: 1000
  - key: free
    rate_limit: {unlimited: true}
";

/// What a broken save, a bad merge or an attacker inserts.
const EDITS: &[&str] = &[
    "",
    " ",
    "\n",
    "\t",
    ":",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    "#",
    "*",
    "&a ",
    "!t ",
    "|",
    "---\n",
    "0",
    "-1",
    "99999999999999999999",
    "unit: ",
    "key:",
    "~",
    "\u{0}",
    "é",
    "\r",
];

fn check_errors(text: &str) -> Result<(), TestCaseError> {
    let files = [RuleFile {
        name: "fuzz.yaml".into(),
        text: text.into(),
    }];
    if let Err(RuleErrors(errors)) = RuleSet::parse(&files) {
        prop_assert!(!errors.is_empty());
        let lines = text.split(['\n', '\r']).count().max(1);
        for e in &errors {
            prop_assert_eq!(&e.file, "fuzz.yaml");
            prop_assert!(
                e.line >= 1 && e.line <= lines + 1,
                "line {} of {lines}: {e}",
                e.line
            );
            prop_assert!(!e.field.is_empty(), "no field: {e}");
            prop_assert!(!e.reason.is_empty(), "no reason: {e}");
        }
    }
    Ok(())
}

fn mutate(text: &str, edits: &[(prop::sample::Index, &str, bool)]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for (at, insert, delete) in edits {
        let at = at.index(bytes.len() + 1);
        if *delete && at < bytes.len() {
            bytes.remove(at);
        }
        bytes.splice(at..at, insert.bytes());
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Descriptor parts from the network: any text, reserved characters likely.
fn part() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["user", "path", "ip", "vip", "/v1/x", "free"])
            .prop_map(str::to_owned),
        "[a-z|=%{}:*/]{0,6}",
        any::<String>(),
        (1usize..3).prop_map(|n| "k".repeat(n * 400)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_text_never_panics_and_errors_say_where(text in any::<String>()) {
        check_errors(&text)?;
    }

    #[test]
    fn random_yamlish_text_never_panics_and_errors_say_where(
        text in "(domain: [a-z]{0,3}\n|descriptors:\n| *- key: [a-z]\n| *rate_limit: \\{[a-z_:, 0-9]{0,20}\\}\n| *[a-z_]{1,8}: [a-z0-9*]{0,4}\n|[\\[\\]{}\"' #:|-]){0,30}",
    ) {
        check_errors(&text)?;
    }

    #[test]
    fn edits_of_a_valid_file_never_panic_and_errors_say_where(
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), prop::sample::select(EDITS), any::<bool>()),
            1..5,
        ),
    ) {
        let valid = [RuleFile { name: "v".into(), text: VALID.into() }];
        prop_assert!(RuleSet::parse(&valid).is_ok(), "the seed file parses");
        check_errors(&mutate(VALID, &edits))?;
    }

    /// Any descriptor resolves without panicking; a storage key for it is
    /// either built or refused naming the field; two different descriptors
    /// that reach one rule never share a storage key.
    #[test]
    fn descriptors_resolve_to_distinct_storage_keys_or_named_refusals(
        descriptors in prop::collection::vec(prop::collection::vec((part(), part()), 0..4), 1..8),
        domain in prop_oneof![Just("api".to_owned()), part()],
    ) {
        let set = RuleSet::parse(&[RuleFile { name: "v".into(), text: VALID.into() }])
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut seen: HashMap<String, Vec<(String, String)>> = HashMap::new();
        for entries in descriptors {
            let borrowed: Vec<(&str, &str)> =
                entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let Some(resolved) = set.resolve(&domain, &borrowed) else { continue };
            let Some(rule) = resolved.rule else { continue };
            match key_prefix(&rule.id, &resolved.counter_key) {
                Ok(key) => {
                    if let Some(other) = seen.get(&key) {
                        prop_assert_eq!(other, &entries, "{} shared by two descriptors", key);
                    }
                    seen.insert(key, entries);
                }
                Err(e) => {
                    prop_assert!(e.field == "key" || e.field == "rule", "{e:?}");
                    prop_assert!(e.reason.contains("at most"), "{e:?}");
                }
            }
        }
    }
}
