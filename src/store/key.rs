//! Storage keys: `mr:{<rule>:<key>}` plus a per-algorithm suffix.
//!
//! The braces are the Redis Cluster hash tag, so every key of one check lands
//! in one slot and a Lua script may touch them all. Rule and key are
//! percent-escaped (`%`, `{`, `}`, `:`) before they go between the braces: no
//! client value can close the tag early, open a second one, or make
//! (rule "a:b", key "c") collide with (rule "a", key "b:c").

use crate::algorithm::InvalidInput;

/// Longest rule name or client key accepted, in bytes (before escaping).
pub const MAX_KEY_LEN: usize = 512;

/// `mr:{<rule>:<key>}` — the prefix every key of this (rule, key) starts with.
pub fn key_prefix(rule: &str, key: &str) -> Result<String, InvalidInput> {
    let mut out = String::with_capacity(rule.len() + key.len() + 8);
    write_prefix(&mut out, rule, key)?;
    Ok(out)
}

/// Checks a rule name and a client key against [`MAX_KEY_LEN`] without
/// building anything: callers that keep a key (caches, demand counts) call
/// it before they store it.
pub fn check(rule: &str, key: &str) -> Result<(), InvalidInput> {
    check_len("rule", rule)?;
    check_len("key", key)
}

fn write_prefix(out: &mut String, rule: &str, key: &str) -> Result<(), InvalidInput> {
    check(rule, key)?;
    out.push_str("mr:{");
    escape_into(rule, out);
    out.push(':');
    escape_into(key, out);
    out.push('}');
    Ok(())
}

fn check_len(field: &'static str, value: &str) -> Result<(), InvalidInput> {
    if value.len() > MAX_KEY_LEN {
        let shown: String = value.chars().take(32).collect();
        return Err(InvalidInput::new(
            field,
            format!("{shown}… ({} bytes)", value.len()),
            format!("must be at most {MAX_KEY_LEN} bytes"),
        ));
    }
    Ok(())
}

/// `mr:allocation:{<region>}`: where the region's pods keep the allocation
/// table they enforce (`store::redis::saved_table`), in one slot of its own.
pub fn allocation_table_key(region: &str) -> String {
    let mut out = String::with_capacity(region.len() + 16);
    out.push_str("mr:allocation:{");
    escape_into(region, &mut out);
    out.push('}');
    out
}

fn escape_into(s: &str, out: &mut String) {
    if !s.contains(['%', '{', '}', ':']) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The hash tag Redis Cluster would use: between the first `{` and the next `}`.
    fn hash_tag(k: &str) -> &str {
        let open = k.find('{').unwrap();
        let close = open + k[open..].find('}').unwrap();
        &k[open + 1..close]
    }

    #[test]
    fn crafted_values_stay_inside_one_tag() {
        let k = key_prefix("r", "a}{b").unwrap();
        assert_eq!(k, "mr:{r:a%7D%7Bb}");
        assert_eq!(hash_tag(&k), "r:a%7D%7Bb");
        assert_ne!(
            key_prefix("a:b", "c").unwrap(),
            key_prefix("a", "b:c").unwrap()
        );
        assert_ne!(
            key_prefix("r", "%7B").unwrap(),
            key_prefix("r", "{").unwrap()
        );
    }

    #[test]
    fn the_allocation_table_key_is_no_counter_key_and_has_its_own_tag() {
        let k = allocation_table_key("mumbai");
        assert_eq!(k, "mr:allocation:{mumbai}");
        assert_eq!(hash_tag(&k), "mumbai");
        assert_eq!(hash_tag(&allocation_table_key("a}b")), "a%7Db");
        assert!(!k.starts_with("mr:{"));
    }

    #[test]
    fn overlong_key_names_field_and_size() {
        let e = key_prefix("r", &"x".repeat(513)).unwrap_err();
        assert_eq!(e.field, "key");
        assert!(e.value.contains("513 bytes"), "{}", e.value);
        assert!(key_prefix("r", &"x".repeat(512)).is_ok());
    }

    proptest! {
        /// Distinct (rule, key) pairs never share a prefix, and the tag is always
        /// the whole escaped pair.
        #[test]
        fn prefixes_are_injective(r1 in "[a:{}%]{0,6}", k1 in "[a:{}%]{0,6}",
                                  r2 in "[a:{}%]{0,6}", k2 in "[a:{}%]{0,6}") {
            let (p1, p2) = (key_prefix(&r1, &k1).unwrap(), key_prefix(&r2, &k2).unwrap());
            prop_assert_eq!(p1 == p2, (r1, k1) == (r2, k2));
            prop_assert_eq!(hash_tag(&p1).len(), p1.len() - 5);
        }
    }
}
