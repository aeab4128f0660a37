//! Reading a YAML node as a typed value. Each reader reports what is wrong
//! at the node's line, naming the field, and returns `None`, so parsing
//! goes on and every error of a file is found in one pass.

use std::time::Duration;

use marked_yaml::Node;
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};

use super::Cx;
use crate::rules::RuleError;
use crate::rules::duration::parse_duration;

pub(super) fn line(node: &Node) -> usize {
    node.span().start().map_or(1, |m| m.line())
}

pub(super) fn scalar_line(node: &MarkedScalarNode) -> usize {
    node.span().start().map_or(1, |m| m.line())
}

/// A plain empty value (`field:`), `~` or `null`: YAML's null.
pub(super) fn is_null(node: &Node) -> bool {
    matches!(node, Node::Scalar(s) if s.may_coerce() && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

pub(super) fn kind(node: &Node) -> &'static str {
    match node {
        Node::Scalar(_) => "a single value",
        Node::Mapping(_) => "a map",
        Node::Sequence(_) => "a list",
    }
}

/// The line of `field`'s key in `map`.
pub(super) fn key_line(map: &MarkedMappingNode, field: &str) -> Option<usize> {
    map.iter()
        .find(|(k, _)| k.as_str() == field)
        .map(|(k, _)| scalar_line(k))
}

impl Cx<'_> {
    pub(super) fn err(&mut self, line: usize, field: impl Into<String>, reason: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.to_owned(),
            line,
            field: field.into(),
            reason: reason.into(),
        });
    }

    /// Reports every field of `map` not in `allowed`.
    /// `allowed`: the accepted field lists, in the order the message names them.
    pub(super) fn check_fields(
        &mut self,
        map: &MarkedMappingNode,
        allowed: &[&[&str]],
        place: &str,
    ) {
        for (k, _) in map.iter() {
            if !allowed.iter().any(|list| list.contains(&k.as_str())) {
                // An empty key (`: x`) is still named, so the error says where.
                let field = if k.as_str().is_empty() {
                    "\"\"".to_owned()
                } else {
                    k.as_str().to_owned()
                };
                self.err(
                    scalar_line(k),
                    field,
                    format!(
                        "unknown field in {place}; expected one of: {}",
                        allowed.concat().join(", ")
                    ),
                );
            }
        }
    }

    /// A single value (numbers and booleans are read as their text).
    pub(super) fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match node {
            Node::Scalar(s) => Some(s.as_str().to_owned()),
            other => {
                self.err(
                    line(other),
                    field,
                    format!("expected a single value, found {}", kind(other)),
                );
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
        let value = node.as_scalar().and_then(MarkedScalarNode::as_bool);
        if value.is_none() && !is_null(node) {
            self.err(line(node), field, "expected true or false");
        }
        value
    }

    pub(super) fn integer(&mut self, node: &Node, field: &str) -> Option<i64> {
        let text = self.string(node, field)?;
        match text.trim().parse::<i64>() {
            Ok(n) => Some(n),
            Err(_) => {
                self.err(
                    line(node),
                    field,
                    format!("expected a whole number, found {text:?}"),
                );
                None
            }
        }
    }

    pub(super) fn duration(&mut self, node: &Node, field: &str) -> Option<Duration> {
        let text = self.string(node, field)?;
        parse_duration(&text)
            .map_err(|reason| self.err(line(node), field, reason))
            .ok()
    }

    /// One of `choices` (exact, lowercase).
    pub(super) fn choice<T: Copy>(
        &mut self,
        node: &Node,
        field: &str,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let text = self.string(node, field)?;
        let found = choices.iter().find(|(name, _)| *name == text);
        if found.is_none() {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            self.err(
                line(node),
                field,
                format!(
                    "unknown value {text:?}; expected one of: {}",
                    names.join(", ")
                ),
            );
        }
        found.map(|(_, v)| *v)
    }
}
