//! Who a certificate names: a coordinator node or a region's limiters,
//! written as a SAN URI (`meridian://node/3`, `meridian://region/mumbai`).
//! Pure: the TLS layer hands in the URIs it read from the certificate.

use std::fmt;

/// The scheme every Meridian identity URI uses.
pub const SCHEME: &str = "meridian://";

/// The holder of a certificate, as its SAN URI names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A coordinator node, by Raft id.
    Node(u64),
    /// The limiters of one region.
    Region(String),
}

impl Identity {
    /// Parses one SAN URI; `None` when it is not a Meridian identity.
    pub fn parse(uri: &str) -> Result<Option<Identity>, String> {
        let Some(rest) = uri.strip_prefix(SCHEME) else {
            return Ok(None);
        };
        let (kind, name) = rest.split_once('/').ok_or_else(|| {
            format!("{uri:?}: expected meridian://node/ID or meridian://region/NAME")
        })?;
        match kind {
            "node" => name
                .parse()
                .map(|id| Some(Identity::Node(id)))
                .map_err(|_| format!("{uri:?}: {name:?} is not a node id")),
            "region" if crate::allocation::valid_region_name(name) => {
                Ok(Some(Identity::Region(name.to_string())))
            }
            "region" => Err(format!("{uri:?}: {name:?} is not a valid region name")),
            _ => Err(format!(
                "{uri:?}: unknown kind {kind:?} (expected node or region)"
            )),
        }
    }

    /// The one identity among a certificate's SAN URIs. A certificate naming
    /// two holders is refused: it would let one key speak as both.
    pub fn from_uris<'a>(uris: impl IntoIterator<Item = &'a str>) -> Result<Identity, String> {
        let mut found = None;
        for uri in uris {
            if let Some(identity) = Identity::parse(uri)? {
                if let Some(first) = &found {
                    return Err(format!(
                        "the certificate names two holders ({first} and {identity}); one is allowed"
                    ));
                }
                found = Some(identity);
            }
        }
        found.ok_or_else(|| {
            "the certificate names no holder: it needs a SAN URI meridian://node/ID or \
             meridian://region/NAME"
                .to_string()
        })
    }

    /// The SAN URI naming this identity.
    pub fn uri(&self) -> String {
        self.to_string()
    }

    /// "node" or "region", for refusals and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Identity::Node(_) => "node",
            Identity::Region(_) => "region",
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Node(id) => write!(f, "{SCHEME}node/{id}"),
            Identity::Region(name) => write!(f, "{SCHEME}region/{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes_and_regions_and_round_trips() {
        for identity in [Identity::Node(3), Identity::Region("mumbai".into())] {
            assert_eq!(Identity::parse(&identity.uri()), Ok(Some(identity.clone())));
        }
    }

    #[test]
    fn other_uris_are_not_identities_but_malformed_meridian_ones_are_errors() {
        assert_eq!(Identity::parse("spiffe://x/y"), Ok(None));
        for bad in [
            "meridian://node/x",
            "meridian://node/",
            "meridian://region/",
            "meridian://region/a b",
            "meridian://pod/a",
            "meridian://node",
        ] {
            assert!(Identity::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_certificate_names_exactly_one_holder() {
        assert_eq!(
            Identity::from_uris(["spiffe://a", "meridian://region/eu"]),
            Ok(Identity::Region("eu".into()))
        );
        assert!(Identity::from_uris(["meridian://node/1", "meridian://region/eu"]).is_err());
        assert!(Identity::from_uris(["spiffe://a"]).is_err());
    }
}
