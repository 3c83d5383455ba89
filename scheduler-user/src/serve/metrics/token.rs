//! `--metrics-token-file`: the bearer token a scrape must show, read once at start.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// Longest token file read.
const MAX_TOKEN_BYTES: u64 = 4096;

/// A token a scrape must send as `Authorization: Bearer TOKEN`.
#[derive(Clone)]
pub(super) struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Reads the token from `path`: its first line, without the line end. The file must not
    /// be readable or writable by others (the token would be every user's), nor empty.
    pub(super) fn read(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot read {shown}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{shown} is not a regular file"));
        }
        if meta.mode() & 0o006 != 0 {
            return Err(format!(
                "{shown} may be read or written by other users, so the token is anyone's; chmod o-rw it"
            ));
        }
        let mut text = Vec::new();
        file.take(MAX_TOKEN_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|e| format!("cannot read {shown}: {e}"))?;
        if text.len() as u64 > MAX_TOKEN_BYTES {
            return Err(format!(
                "{shown} is longer than {MAX_TOKEN_BYTES} bytes; a token is one line"
            ));
        }
        let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
        let token = line.strip_suffix(b"\r").unwrap_or(line);
        if token.is_empty() || token.iter().any(|b| b.is_ascii_whitespace() || *b < 0x20) {
            return Err(format!(
                "{shown} must hold a token on its first line, without spaces"
            ));
        }
        Ok(Self(token.to_vec()))
    }

    /// Whether `shown` is the token, in a time that does not depend on where they differ.
    pub(super) fn admits(&self, shown: Option<&[u8]>) -> bool {
        let Some(shown) = shown else {
            return false;
        };
        // Every byte of the longer is looked at, so neither the time nor an early return tells
        // how much of a guess was right; only whether the lengths differ.
        let mut differ = u8::from(shown.len() != self.0.len());
        for at in 0..shown.len().max(self.0.len()) {
            let a = self.0.get(at).copied().unwrap_or(0);
            let b = shown.get(at).copied().unwrap_or(0);
            differ |= a ^ b;
        }
        std::hint::black_box(differ) == 0
    }

    #[cfg(test)]
    pub(super) fn of(text: &str) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn only_the_token_itself_is_admitted() {
        let token = Token::of("s3cret");
        assert!(token.admits(Some(b"s3cret")));
        for wrong in [&b"s3cre"[..], b"s3cret0", b"S3cret", b"", b"s3cret\0"] {
            assert!(!token.admits(Some(wrong)), "{wrong:?}");
        }
        assert!(!token.admits(None));
    }

    #[test]
    fn a_token_file_is_one_private_line() {
        let dir = std::env::temp_dir().join(format!("abiss-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let write = |text: &str, mode: u32| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("abc123\n", 0o640);
        assert!(Token::read(&path).unwrap().admits(Some(b"abc123")));
        write("abc123\r\nmore\n", 0o600);
        assert!(Token::read(&path).unwrap().admits(Some(b"abc123")));
        write("abc123\n", 0o644);
        assert!(Token::read(&path).unwrap_err().contains("other users"));
        for bad in ["\n", "", "a b\n"] {
            write(bad, 0o600);
            assert!(
                Token::read(&path).unwrap_err().contains("first line"),
                "{bad:?}"
            );
        }
        assert!(Token::read(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
