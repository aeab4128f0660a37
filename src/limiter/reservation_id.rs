//! Reservation ids: what `commit(id, actual)` and `release(id)` are given,
//! and all they are given. An id names the region that made it, the rule
//! (by id) and counter key it holds, and a 128-bit random nonce, as
//! `r1.` + unpadded base64url of
//! `len(region) region len(rule) rule len(key) key nonce` (lengths as
//! 2-byte big-endian). Opaque to clients, safe in a URL or a header.
//!
//! Nothing in it is trusted: the rule and key only say where to look, and
//! the store finds a record only under that key with that nonce, so an
//! altered id finds nothing ("unknown id") and a guessed one 2^-128 of the
//! time.

use crate::algorithm::InvalidInput;
use crate::store::key::MAX_KEY_LEN;
use crate::store::reservation::Nonce;

const VERSION: &str = "r1.";
/// Longest id accepted: a region name, a rule id and a key at their
/// longest, encoded (refused before decoding).
pub const MAX_ID_LEN: usize = 4 * (2 * 3 + 128 + 2 * MAX_KEY_LEN + 16) / 3 + 8;

/// A decoded reservation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationId {
    /// The region whose store holds the record.
    pub region: String,
    /// The rule's id (`Rule::id`).
    pub rule: String,
    /// The counter key within the rule.
    pub key: String,
    /// The record's name in the store.
    pub nonce: Nonce,
}

impl ReservationId {
    /// The id's text.
    pub fn encode(&self) -> String {
        let mut raw =
            Vec::with_capacity(6 + self.region.len() + self.rule.len() + self.key.len() + 16);
        for part in [&self.region, &self.rule, &self.key] {
            // Every part is bounded far below 65,536 bytes (regions by the
            // CLI, rules and keys by `MAX_KEY_LEN`).
            raw.extend_from_slice(&(part.len().min(u16::MAX as usize) as u16).to_be_bytes());
            raw.extend_from_slice(part.as_bytes());
        }
        raw.extend_from_slice(&self.nonce);
        format!("{VERSION}{}", base64url(&raw))
    }

    /// Reads an id, refusing anything not made by [`ReservationId::encode`]
    /// with the field `id` named.
    pub fn decode(text: &str) -> Result<ReservationId, InvalidInput> {
        let bad = |why: &str| {
            let shown: String = text.chars().take(48).collect();
            InvalidInput::new("id", shown, why.to_owned())
        };
        if text.is_empty() {
            return Err(bad("missing: give the id reserve answered"));
        }
        if text.len() > MAX_ID_LEN {
            return Err(bad("longer than any reservation id"));
        }
        let body = text
            .strip_prefix(VERSION)
            .ok_or_else(|| bad("not a reservation id (they start with r1.)"))?;
        let raw = unbase64url(body).ok_or_else(|| bad("not a reservation id (bad encoding)"))?;
        let mut rest = raw.as_slice();
        let mut part = || -> Option<String> {
            let (len, tail) = rest.split_first_chunk::<2>()?;
            let len = u16::from_be_bytes(*len) as usize;
            let (text, tail) = (tail.get(..len)?, tail.get(len..)?);
            rest = tail;
            String::from_utf8(text.to_vec()).ok()
        };
        let (Some(region), Some(rule), Some(key)) = (part(), part(), part()) else {
            return Err(bad("not a reservation id (truncated)"));
        };
        let nonce: Nonce = rest
            .try_into()
            .map_err(|_| bad("not a reservation id (bad nonce)"))?;
        if rule.len() > MAX_KEY_LEN || key.len() > MAX_KEY_LEN {
            return Err(bad("not a reservation id (over-long rule or key)"));
        }
        Ok(ReservationId {
            region,
            rule,
            key,
            nonce,
        })
    }
}

/// A fresh random nonce.
pub fn nonce() -> Nonce {
    rand::random()
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn unbase64url(text: &str) -> Option<Vec<u8>> {
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            let v = ALPHABET.iter().position(|a| a == c)? as u32;
            n |= v << (18 - 6 * i);
        }
        let bytes = chunk.len() - 1;
        // Canonical only: unused low bits must be zero.
        if n & ((1 << (8 * (3 - bytes))) - 1) != 0 {
            return None;
        }
        out.extend((0..bytes).map(|i| (n >> (16 - 8 * i)) as u8));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ids_round_trip(region in ".{0,20}", rule in ".{0,60}", key in ".{0,60}", nonce in any::<[u8; 16]>()) {
            let id = ReservationId { region, rule, key, nonce };
            let text = id.encode();
            prop_assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
            prop_assert_eq!(ReservationId::decode(&text).unwrap(), id);
        }

        #[test]
        fn any_text_is_refused_or_decoded_never_a_panic(text in ".{0,200}") {
            if let Err(e) = ReservationId::decode(&text) {
                prop_assert_eq!(e.field, "id");
            }
        }
    }

    #[test]
    fn altered_ids_are_refused_naming_the_field() {
        let id = ReservationId {
            region: "eu".into(),
            rule: "api|customer".into(),
            key: "customer=42".into(),
            nonce: [7; 16],
        };
        let text = id.encode();
        for bad in [
            "",
            "x",
            "r1.",
            &text[..text.len() - 3],
            &format!("{text}A"),
            "r1.!!!!",
        ] {
            let e = ReservationId::decode(bad).expect_err(bad);
            assert_eq!(e.field, "id", "{bad}");
        }
        // A changed character decodes to another id or none; never the same.
        let mut changed = text.clone().into_bytes();
        let at = changed.len() - 5;
        changed[at] = if changed[at] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(changed).expect("ascii");
        assert_ne!(ReservationId::decode(&changed).ok(), Some(id));
    }
}
