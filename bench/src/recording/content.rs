//! The test recorder's pattern, and a recording read back against it: every 8-byte word of
//! what `abiss-test-recorder` writes holds its own file offset, little-endian, so each byte
//! read back says whether it is the one written there (a piece written at the wrong place, a
//! lost or doubled piece, a tail padded wrong).

use std::path::Path;

use super::recorder::{RecorderKind, RecorderResult, TEST_WRITE_BYTES};

impl RecorderResult {
    /// The test recorder's file against its pattern (see [`RecorderResult::content`]): read
    /// back once the row's load has stopped.
    /// The file must also be as long as the recorder says it wrote (its `writes` of 64 KiB), so
    /// a lost tail is not "intact".
    pub fn check_content(&mut self) {
        if self.kind != RecorderKind::Test {
            return;
        }
        let written = self
            .own_report
            .as_ref()
            .and_then(|report| report["writes"].as_u64())
            .map(|writes| writes * TEST_WRITE_BYTES);
        self.content = Some(match (first_wrong_byte(&self.file), written) {
            (Err(error), _) => format!("unreadable: {error}"),
            (Ok(Some(at)), _) => format!("byte {at} is not what was written there"),
            (Ok(None), Some(bytes)) if bytes != self.file_bytes => {
                format!("{} bytes, {bytes} written", self.file_bytes)
            }
            (Ok(None), None) => "no count of what was written".to_owned(),
            (Ok(None), Some(_)) => "intact".to_owned(),
        });
    }
}

/// The byte the test recorder writes at file offset `offset`: each 8-byte word of its
/// recordings holds its own offset, little-endian, so each byte read back says whether it is
/// the one written there.
#[must_use]
pub fn pattern_byte(offset: u64) -> u8 {
    (offset & !7).to_le_bytes()[usize::try_from(offset & 7).unwrap_or(0)]
}

/// The offset of the first byte of `file` that breaks the test recorder's pattern
/// ([`pattern_byte`]), if any.
fn first_wrong_byte(file: &Path) -> std::io::Result<Option<u64>> {
    use std::io::Read as _;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file)?);
    let mut chunk = vec![0_u8; 1 << 20];
    let mut at = 0_u64;
    loop {
        // Whole chunks but at the end, so that each word is read whole.
        let mut got = 0;
        while got < chunk.len() {
            match reader.read(&mut chunk[got..])? {
                0 => break,
                read => got += read,
            }
        }
        if got == 0 {
            return Ok(None);
        }
        for (index, byte) in chunk[..got].iter().enumerate() {
            let offset = at + index as u64;
            if *byte != pattern_byte(offset) {
                return Ok(Some(offset));
            }
        }
        at += got as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_in_the_pattern_is_intact_and_a_changed_byte_is_found() {
        let dir = std::env::temp_dir().join(format!("abiss-pattern-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("recording.ts");
        // Not a whole number of words, and longer than one chunk of the check.
        let mut bytes: Vec<u8> = (0..(1_u64 << 20) + 13).map(pattern_byte).collect();
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(first_wrong_byte(&file).unwrap(), None);
        bytes[(1 << 20) + 9] ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(first_wrong_byte(&file).unwrap(), Some((1 << 20) + 9));
        // A piece written twice: the second copy's bytes are not those of their place.
        bytes.truncate(64);
        bytes.extend_from_within(0..16);
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(first_wrong_byte(&file).unwrap(), Some(64));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
