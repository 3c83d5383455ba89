//! Resolves the kernel struct offsets the eBPF programs need from the running kernel's BTF.
//!
//! Rust eBPF has no CO-RE field relocations, so instead of compiling offsets in, the daemon looks
//! them up here and writes them into the programs' read-only data before loading. A kernel whose
//! structs lack a field fails here, by name, rather than in the verifier or at run time; a
//! field or tracepoint that only an optional part needs switches that part off instead
//! (`crate::capabilities`).

use std::path::{Path, PathBuf};

use btf_rs::{Btf, Type};
use scheduler_common::KernelLayout;

use crate::capabilities::Feature;

/// Where the kernel publishes its own BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Failures to resolve the kernel layout.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The BTF file does not exist: the kernel was built without BTF.
    #[error("this kernel has no BTF ({path} is missing); abissd needs a kernel built with CONFIG_DEBUG_INFO_BTF=y")]
    NoBtf {
        /// The path looked at.
        path: PathBuf,
    },
    /// The BTF could not be parsed.
    #[error("cannot read the kernel BTF at {path}: {message}")]
    Unreadable {
        /// The path read.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A struct or field the block programs need is not in this kernel.
    #[error("this kernel's BTF has no {what}; abiss needs Linux 5.15 or newer")]
    Missing {
        /// `struct.field` that was looked for.
        what: String,
    },
}

/// What the running kernel offers the programs: the struct offsets they read, and the
/// optional parts whose hooks or fields it lacks (with the reason, for the log and `status`).
#[derive(Debug)]
pub struct KernelSupport {
    /// The offsets, written into the programs' read-only data.
    pub layout: KernelLayout,
    /// Optional parts this kernel cannot run, and why.
    pub missing: Vec<(Feature, String)>,
}

/// Reads the offsets the programs need from the BTF at `path`, and which optional parts the
/// kernel lacks. A field of the required block programs that is missing is an error.
pub fn resolve(path: &Path) -> Result<KernelSupport, LayoutError> {
    probe(path).map(|(support, _)| support)
}

/// [`resolve`], and the optional parts whose stand-in tracepoints this kernel has
/// ([`Feature::stand_in`]): what `abissctl doctor` reports of a part the kernel lacks.
pub fn probe(path: &Path) -> Result<(KernelSupport, Vec<Feature>), LayoutError> {
    if !path.exists() {
        return Err(LayoutError::NoBtf {
            path: path.to_path_buf(),
        });
    }
    let unreadable = |message: String| LayoutError::Unreadable {
        path: path.to_path_buf(),
        message,
    };
    // Read beside the parse below: the kernel writes its 200 000 symbols out a page per read
    // (70 ms at abissd's start on the lab machine).
    let iomap_dio_end_io = std::thread::spawn(|| kernel_symbol("iomap_dio_bio_end_io"));
    // Parsed from memory: from the file, the parser asked the kernel for its position in it
    // (an `lseek`) at every type, most of abissd's start-up.
    let bytes = std::fs::read(path).map_err(|error| unreadable(error.to_string()))?;
    let btf = Btf::from_bytes(&bytes).map_err(|error| unreadable(error.to_string()))?;
    let finder = FieldFinder { btf: &btf };
    let stand_ins = finder.stand_ins();
    let mut missing = finder.missing_tracepoints();
    let mut optional = |feature: Feature, name: &str, field: &str| {
        finder.offset(name, field).unwrap_or_else(|_| {
            if !missing.iter().any(|(f, _)| *f == feature) {
                missing.push((
                    feature,
                    format!("struct {name}.{field} missing from this kernel"),
                ));
            }
            0
        })
    };
    let io_kiocb_file = optional(Feature::UringReports, "io_kiocb", "file");
    let io_kiocb_cmd = optional(Feature::UringReports, "io_kiocb", "cmd");
    let kiocb_ioprio = optional(Feature::UringReports, "kiocb", "ki_ioprio");
    let iomap_dio_iocb = optional(Feature::DirectIoTagging, "iomap_dio", "iocb");
    let kiocb_filp = optional(Feature::DirectIoTagging, "kiocb", "ki_filp");
    let mut iomap_dio_end_io = (iomap_dio_end_io.join())
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        .unwrap_or(0);
    if iomap_dio_end_io == 0 {
        missing.push((
            Feature::DirectIoTagging,
            "iomap_dio_bio_end_io is not in /proc/kallsyms (or its addresses are hidden)".into(),
        ));
    }
    if missing.iter().any(|(f, _)| *f == Feature::DirectIoTagging) {
        // The block programs test this address before following a bio to its file.
        iomap_dio_end_io = 0;
    }
    let layout = KernelLayout {
        valid: 1,
        request_q: finder.offset("request", "q")?,
        request_cmd_flags: finder.offset("request", "cmd_flags")?,
        request_data_len: finder.offset("request", "__data_len")?,
        request_sector: finder.offset("request", "__sector")?,
        request_bio: finder.offset("request", "bio")?,
        queue_disk: finder.offset("request_queue", "disk")?,
        gendisk_major: finder.offset("gendisk", "major")?,
        gendisk_first_minor: finder.offset("gendisk", "first_minor")?,
        bio_ioprio: finder.offset("bio", "bi_ioprio")?,
        bio_io_vec: finder.offset("bio", "bi_io_vec")?,
        bvec_page: finder.offset("bio_vec", "bv_page")?,
        page_compound_head: finder.offset("page", "compound_head")?,
        page_mapping: finder.offset("page", "mapping")?,
        mapping_host: finder.offset("address_space", "host")?,
        inode_ino: finder.offset("inode", "i_ino")?,
        inode_sb: finder.offset("inode", "i_sb")?,
        sb_dev: finder.offset("super_block", "s_dev")?,
        io_kiocb_file,
        io_kiocb_cmd,
        kiocb_ioprio,
        file_inode: finder.offset("file", "f_inode")?,
        bio_end_io: finder.offset("bio", "bi_end_io")?,
        bio_private: finder.offset("bio", "bi_private")?,
        iomap_dio_iocb,
        kiocb_filp,
        task_flags: finder.offset("task_struct", "flags")?,
        task_pid: finder.offset("task_struct", "pid")?,
        task_io_context: finder.offset("task_struct", "io_context")?,
        task_start_boottime: finder.offset("task_struct", "start_boottime")?,
        iomap_dio_end_io,
    };
    Ok((KernelSupport { layout, missing }, stand_ins))
}

struct FieldFinder<'a> {
    btf: &'a Btf,
}

impl FieldFinder<'_> {
    /// The optional parts whose tracepoints this kernel lacks, with the first one missing.
    fn missing_tracepoints(&self) -> Vec<(Feature, String)> {
        Feature::ALL
            .into_iter()
            .filter_map(|feature| {
                let tracepoint = feature
                    .programs()
                    .iter()
                    .map(|(_, tracepoint)| *tracepoint)
                    .find(|tracepoint| !self.has_tracepoint(tracepoint))?;
                Some((
                    feature,
                    format!("tracepoint {tracepoint} missing from this kernel"),
                ))
            })
            .collect()
    }

    /// The optional parts whose stand-in programs' tracepoints this kernel has.
    fn stand_ins(&self) -> Vec<Feature> {
        Feature::ALL
            .into_iter()
            .filter(|feature| {
                feature.stand_in().is_some_and(|(programs, _)| {
                    programs
                        .iter()
                        .all(|(_, tracepoint)| self.has_tracepoint(tracepoint))
                })
            })
            .collect()
    }

    /// Whether the kernel has tracepoint `name`: each one has a `btf_trace_<name>` typedef,
    /// which is what a BTF tracepoint program attaches by.
    fn has_tracepoint(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(&format!("btf_trace_{name}"))
            .is_ok_and(|types| !types.is_empty())
    }

    /// Byte offset of `field` in `struct name`, looking through anonymous structs and unions.
    fn offset(&self, name: &str, field: &str) -> Result<u32, LayoutError> {
        let missing = || LayoutError::Missing {
            what: format!("struct {name}.{field}"),
        };
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|_| missing())?;
        let layout = types
            .iter()
            .find_map(|t| match t {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
            .ok_or_else(missing)?;
        let bits = self.find(layout, field, 0).ok_or_else(missing)?;
        if bits % 8 != 0 {
            return Err(missing());
        }
        Ok(bits / 8)
    }

    fn find(&self, layout: &btf_rs::Struct, field: &str, base_bits: u32) -> Option<u32> {
        for member in &layout.members {
            let name = self.btf.resolve_name(member).unwrap_or_default();
            let bits = base_bits + member.bit_offset();
            if name == field {
                return Some(bits);
            }
            if name.is_empty() {
                if let Some(inner) = self.anonymous_aggregate(member) {
                    if let Some(found) = self.find(&inner, field, bits) {
                        return Some(found);
                    }
                }
            }
        }
        None
    }

    fn anonymous_aggregate(&self, member: &btf_rs::Member) -> Option<btf_rs::Struct> {
        let mut current = self.btf.resolve_chained_type(member).ok()?;
        // Skip qualifiers and typedefs down to the aggregate.
        for _ in 0..8 {
            match current {
                Type::Struct(s) | Type::Union(s) => return Some(s),
                Type::Typedef(ref t) => current = self.btf.resolve_chained_type(t).ok()?,
                Type::Const(ref t) | Type::Volatile(ref t) => {
                    current = self.btf.resolve_chained_type(t).ok()?;
                }
                _ => return None,
            }
        }
        None
    }
}

/// The address of kernel function `name`, from `/proc/kallsyms` (none when the file hides
/// addresses or lacks the symbol).
#[must_use]
pub fn kernel_symbol(name: &str) -> Option<u64> {
    let symbols = std::fs::read_to_string("/proc/kallsyms").ok()?;
    symbol_in(&symbols, name)
}

/// The address of text symbol `name` in `kallsyms` (the file's text). Only the lines naming
/// it are split into fields: splitting all 200 000 took a fifth of abissd's start-up.
fn symbol_in(kallsyms: &str, name: &str) -> Option<u64> {
    let needle = format!(" {name}");
    kallsyms.match_indices(&needle).find_map(|(at, _)| {
        let end = at + needle.len();
        // The whole name, not a prefix of a longer one (a module's follows after a tab).
        if !matches!(kallsyms.as_bytes().get(end), None | Some(b'\n' | b'\t')) {
            return None;
        }
        let start = kallsyms[..at].rfind('\n').map_or(0, |newline| newline + 1);
        let mut fields = kallsyms[start..end].split_whitespace();
        let address = u64::from_str_radix(fields.next()?, 16).ok()?;
        let kind = fields.next()?;
        let symbol = fields.next()?;
        (symbol == name && kind.eq_ignore_ascii_case("t") && address != 0).then_some(address)
    })
}

/// The running kernel's release (`uname -r`).
#[must_use]
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symbol_is_found_by_its_whole_name_and_kind() {
        let kallsyms = "ffffffff81000000 T _stext\n\
                        ffffffff81200000 T iomap_dio_bio_end_io_two\n\
                        ffffffff81300000 d iomap_dio_bio_end_io\n\
                        ffffffff81400000 t iomap_dio_bio_end_io\n\
                        ffffffffc0000000 t helper\t[loop]\n\
                        0000000000000000 T hidden";
        assert_eq!(
            symbol_in(kallsyms, "iomap_dio_bio_end_io"),
            Some(0xffff_ffff_8140_0000)
        );
        assert_eq!(symbol_in(kallsyms, "_stext"), Some(0xffff_ffff_8100_0000));
        assert_eq!(symbol_in(kallsyms, "helper"), Some(0xffff_ffff_c000_0000));
        assert_eq!(
            symbol_in(kallsyms, "hidden"),
            None,
            "a zero address is hidden"
        );
        assert_eq!(symbol_in(kallsyms, "iomap"), None);
    }

    /// Runs against this machine's kernel: the fields the programs read must all resolve, and
    /// to offsets that agree with the layout every 64-bit kernel has had for years.
    #[test]
    fn resolves_the_running_kernel() {
        if !Path::new(KERNEL_BTF).exists() {
            eprintln!("skipped: {KERNEL_BTF} missing (kernel without BTF)");
            return;
        }
        let support = resolve(Path::new(KERNEL_BTF)).expect("layout resolves");
        assert!(
            support.missing.is_empty(),
            "this kernel has every hook: {:?}",
            support.missing
        );
        let layout = support.layout;
        assert_eq!(layout.valid, 1);
        assert_eq!(layout.request_q, 0, "struct request starts with its queue");
        assert_eq!(layout.bvec_page, 0, "struct bio_vec starts with its page");
        assert!(layout.page_mapping > layout.page_compound_head.saturating_sub(8));
        assert!(layout.gendisk_first_minor == layout.gendisk_major + 4);
    }

    #[test]
    fn a_missing_btf_file_is_named() {
        let error = resolve(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(matches!(error, LayoutError::NoBtf { .. }));
        assert!(error.to_string().contains("CONFIG_DEBUG_INFO_BTF"));
    }

    #[test]
    fn a_corrupt_btf_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("abiss-btf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("vmlinux");
        std::fs::write(&file, b"not btf at all").unwrap();
        let error = resolve(&file).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(error, LayoutError::Unreadable { .. }));
    }
}
