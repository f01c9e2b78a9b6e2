//! Deterministic failure injection for tests: a named point in a pipeline
//! stage fails in a chosen way at a chosen item, so crash, panic, stall and
//! interrupt tests need no sleeps or timing.
//!
//! Points are configured by a spec, from the `SHARDFEED_FAILPOINTS`
//! environment variable (read when a loader or a `shard` run starts) or set
//! in code: `point=action[@item]` entries separated by `;`, for example
//! `decode=panic@5;collate=stop@2`. Without `@item` every item fails.
//!
//! | action | effect |
//! |---|---|
//! | `panic` | the stage panics |
//! | `error` | the stage fails with an injected error |
//! | `stop` | the stage returns early without a word (a silent stop) |
//! | `block` | the stage waits until the run is cancelled |
//! | `exit` | the process exits at once with status 137 (as if killed) |
//! | `slow:MS` | the stage's work on the item takes MS milliseconds longer (decode only) |
//!
//! With no spec (the normal case) a check is one branch on an empty list.

use std::str::FromStr;

/// The environment variable holding the spec.
pub const ENV: &str = "SHARDFEED_FAILPOINTS";

/// What a failpoint does when hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Panic.
    Panic,
    /// Return an injected error.
    Error,
    /// Return early, silently.
    Stop,
    /// Wait until cancelled.
    Block,
    /// Exit the process with status 137.
    Exit,
    /// Take this many milliseconds longer over the item, then work as usual
    /// (a slow stage, for the metrics tests; honoured by `decode` and
    /// `read`).
    Slow(u64),
}

impl FromStr for Action {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "panic" => Action::Panic,
            "error" => Action::Error,
            "stop" => Action::Stop,
            "block" => Action::Block,
            "exit" => Action::Exit,
            other if other.starts_with("slow:") => {
                Action::Slow(other["slow:".len()..].parse().map_err(|_| {
                    format!("failpoint action {other:?}: slow:MS takes milliseconds")
                })?)
            }
            other => {
                return Err(format!(
                    "unknown failpoint action {other:?}; use panic, error, stop, block, exit or slow:MS"
                ));
            }
        })
    }
}

/// A set of configured failpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failpoints {
    points: Vec<(String, Action, Option<u64>)>,
}

impl Failpoints {
    /// Parse a spec (see the module docs).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut points = Vec::new();
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, rest) = entry
                .split_once('=')
                .ok_or_else(|| format!("failpoint {entry:?} is not point=action[@item]"))?;
            let (action, item) = match rest.split_once('@') {
                Some((a, i)) => (
                    a,
                    Some(
                        i.parse::<u64>()
                            .map_err(|_| format!("failpoint {entry:?}: {i:?} is not a number"))?,
                    ),
                ),
                None => (rest, None),
            };
            points.push((name.trim().to_string(), action.trim().parse()?, item));
        }
        Ok(Failpoints { points })
    }

    /// The failpoints of [`ENV`], none if it is unset.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(ENV) {
            Ok(spec) => Self::parse(&spec),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Whether no failpoint is configured.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The action configured for `point` at `item`, if any. `Exit` is
    /// carried out here: the process ends with status 137.
    pub fn hit(&self, point: &str, item: u64) -> Option<Action> {
        if self.points.is_empty() {
            return None;
        }
        let action = self
            .points
            .iter()
            .find(|(name, _, at)| name == point && at.is_none_or(|a| a == item))
            .map(|(_, action, _)| *action)?;
        if action == Action::Exit {
            // As abrupt as a kill: no destructors, no cleanup.
            std::process::exit(137);
        }
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_match_items() {
        let f = Failpoints::parse("decode=panic@5; collate=stop").unwrap();
        assert_eq!(f.hit("decode", 4), None);
        assert_eq!(f.hit("decode", 5), Some(Action::Panic));
        assert_eq!(f.hit("collate", 0), Some(Action::Stop));
        assert_eq!(f.hit("fetch", 5), None);
        assert!(Failpoints::parse("decode").is_err());
        assert!(Failpoints::parse("decode=explode").is_err());
        assert!(Failpoints::parse("decode=panic@x").is_err());
        assert!(Failpoints::parse("").unwrap().is_empty());
    }
}
