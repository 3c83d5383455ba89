//! The id abissd gives a stream ([`StreamId`]).

use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A stream's id, as abissd numbers its streams (from 1, never reused while it runs). On the
/// wire it is the bare number, as it always was.
///
/// Its own type so that a stream id is not taken for a file's tag (the kernel's
/// `AttachedFile::stream`, the id of the file's first stream, which outlives that stream), a
/// byte count or a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamId(pub u64);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// As `abissctl attach` prints it, and as a command line names it.
impl FromStr for StreamId {
    type Err = ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(Self)
    }
}

impl From<u64> for StreamId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_id_is_the_bare_number_on_the_wire() {
        assert_eq!(serde_json::to_string(&StreamId(42)).unwrap(), "42");
        assert_eq!(
            serde_json::from_str::<StreamId>("42").unwrap(),
            StreamId(42)
        );
        assert_eq!(StreamId(7).to_string(), "7");
        assert_eq!("7".parse::<StreamId>(), Ok(StreamId(7)));
        assert!("seven".parse::<StreamId>().is_err());
    }
}
