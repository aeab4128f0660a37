//! The cluster id: 128 random bits that name one coordinator cluster for its
//! whole life. The first leader sets it in the replicated state
//! (`Command::SetClusterId`), every `Watch` update carries it, and a limiter
//! takes rules only from the cluster whose id it holds, so a limiter pointed
//! at another cluster's node (staging's, say) keeps its own rules even when
//! that cluster's version numbers are higher.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A cluster's id. Written as 32 lowercase hex digits wherever people or JSON
/// see it (logs, the admin API, `--cluster-id`, the limiter's rules cache);
/// as its 16 bytes in the Raft store's bincode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId([u8; 16]);

impl ClusterId {
    /// A new id from the thread's CSPRNG: two clusters never share one, so
    /// it needs no registry and no coordination between clusters.
    pub fn random() -> ClusterId {
        ClusterId(rand::random())
    }
}

/// Why a text is not a cluster id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a cluster id: expected 32 hex digits (as GET /api/v1/cluster shows it)")]
pub struct BadClusterId {
    /// The offending text, cut to 64 characters so a log line stays short.
    pub text: String,
}

impl FromStr for ClusterId {
    type Err = BadClusterId;

    fn from_str(s: &str) -> Result<ClusterId, BadClusterId> {
        let bad = || BadClusterId {
            text: s.chars().take(64).collect(),
        };
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(ClusterId(bytes))
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl Serialize for ClusterId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for ClusterId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ClusterId, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            text.parse().map_err(serde::de::Error::custom)
        } else {
            <[u8; 16]>::deserialize(deserializer).map(ClusterId)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_bad_text_is_refused_naming_it() {
        let id = ClusterId::random();
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(text.parse::<ClusterId>(), Ok(id));
        assert_eq!(
            "00112233445566778899AABBCCDDEEFF"
                .parse::<ClusterId>()
                .map(|c| c.to_string()),
            Ok("00112233445566778899aabbccddeeff".to_string())
        );
        for bad in [
            "",
            "abc",
            "00112233445566778899aabbccddeeg0",
            "é0112233445566778899aabbccddeef",
        ] {
            let err = bad.parse::<ClusterId>().expect_err(bad);
            assert!(err.to_string().contains("32 hex digits"), "{err}");
        }
        assert_ne!(ClusterId::random(), ClusterId::random());
    }

    #[test]
    fn json_holds_hex_and_bincode_holds_the_16_bytes() {
        let id: ClusterId = "00112233445566778899aabbccddeeff".parse().expect("id");
        let json = serde_json::to_string(&id).expect("json");
        assert_eq!(json, "\"00112233445566778899aabbccddeeff\"");
        assert_eq!(serde_json::from_str::<ClusterId>(&json).expect("back"), id);
        let bytes = bincode::serialize(&id).expect("bincode");
        assert_eq!(bytes.len(), 16);
        assert_eq!(bincode::deserialize::<ClusterId>(&bytes).expect("back"), id);
    }
}
