//! The configuration file, `/etc/abiss/abissd.toml`: abissd's long options as TOML keys, so
//! that a service unit needs no arguments.
//!
//! ```toml
//! device = ["sdb", "sdc"]      # repeatable options take a list
//! elevator = "mq-deadline"
//! capacity = "30MB/s"
//! realtime_share = 80
//! no_raises = false          # a flag is on with `true`
//! ```
//!
//! A key is a long option with `_` or `-` between words. The file is turned into arguments
//! and parsed by the same command-line parser as the flags, so every value is checked alike,
//! and an option given on the command line (or in its environment variable) overrides the
//! file's key for it. The daemon reads the file again on SIGHUP.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;

/// Where abissd looks for its configuration unless `--config` says otherwise.
pub(crate) const DEFAULT_CONFIG: &str = "/etc/abiss/abissd.toml";

/// The largest configuration file read: a list of disks and a few settings are far smaller,
/// and the file is read again on every reload.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// Options that make no sense in the file.
const NOT_IN_FILE: [&str; 3] = ["config", "help", "version"];

/// Why the configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is too large to be a configuration.
    #[error("the configuration file {path} is over 64 KiB; it holds a few settings")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not TOML, or a key or value is wrong.
    #[error("in the configuration file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        reason: String,
    },
}

/// The arguments to parse: the program name, the file's settings for every option the
/// command line does not give, then the command line itself.
///
/// `command` is the daemon's command-line definition; `args` the command line, program name
/// first. A missing file is no error when it is the default one (`required` false): the
/// daemon then runs on its flags alone.
pub(crate) fn merge(
    command: &clap::Command,
    file: &Path,
    required: bool,
    args: &[OsString],
) -> Result<Vec<OsString>, ConfigError> {
    let text = match read(file) {
        Ok(text) => text,
        Err(ConfigError::Read { source, .. })
            if !required && source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(args.to_vec());
        }
        Err(error) => return Err(error),
    };
    let invalid = |reason: String| ConfigError::Invalid {
        path: file.to_owned(),
        reason,
    };
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| invalid(e.message().to_owned()))?;
    // Which options the command line gives: those keep their command-line value.
    let given = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(args)
        .ok();
    let from_command_line = |id: &str| {
        given.as_ref().is_some_and(|m| {
            matches!(
                m.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
    };
    let program = args.first().cloned().unwrap_or_else(|| "abissd".into());
    let mut from_file = vec![program.clone()];
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| {
                a.get_long() == Some(long.as_str())
                    || a.get_all_aliases().is_some_and(|all| all.contains(&long.as_str()))
            })
            .filter(|_| !NOT_IN_FILE.contains(&long.as_str()))
            .ok_or_else(|| {
                invalid(format!(
                    "unknown setting `{key}`; the settings are abissd's long options (abissd --help)"
                ))
            })?;
        if from_command_line(arg.get_id().as_str()) {
            continue;
        }
        push_setting(&mut from_file, key, &long, value).map_err(invalid)?;
    }
    // The file's settings alone must parse, so an error names the file rather than a flag
    // the user never typed.
    command
        .clone()
        .try_get_matches_from(&from_file)
        .map_err(|e| invalid(first_line(&e.render().to_string())))?;
    from_file.extend(args.iter().skip(1).cloned());
    Ok(from_file)
}

fn read(file: &Path) -> Result<String, ConfigError> {
    let error = |source| ConfigError::Read {
        path: file.to_owned(),
        source,
    };
    let meta = std::fs::metadata(file).map_err(error)?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: file.to_owned(),
        });
    }
    std::fs::read_to_string(file).map_err(error)
}

/// Appends `--long VALUE` (repeated for a list, alone for a `true` flag).
fn push_setting(
    out: &mut Vec<OsString>,
    key: &str,
    long: &str,
    value: &toml::Value,
) -> Result<(), String> {
    let flag = OsString::from(format!("--{long}"));
    let scalar = |value: &toml::Value| match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Float(x) => Ok(x.to_string()),
        other => Err(format!(
            "`{key}` must be a string or a number, not {}",
            other.type_str()
        )),
    };
    match value {
        toml::Value::Boolean(true) => out.push(flag),
        toml::Value::Boolean(false) => {}
        toml::Value::Array(items) => {
            for item in items {
                out.push(flag.clone());
                out.push(scalar(item)?.into());
            }
        }
        other => {
            out.push(flag);
            out.push(scalar(other)?.into());
        }
    }
    Ok(())
}

/// clap's error, without its usage lines and in one sentence.
fn first_line(rendered: &str) -> String {
    rendered
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .replace("the argument '--", "the setting '--")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn command() -> Command {
        Command::new("abissd")
            .arg(Arg::new("devices").long("device").action(ArgAction::Append))
            .arg(
                Arg::new("capacity")
                    .long("capacity")
                    .default_value("20MB/s"),
            )
            .arg(
                Arg::new("realtime_share")
                    .long("realtime-share")
                    .value_parser(clap::value_parser!(u32).range(1..=95)),
            )
            .arg(
                Arg::new("no_raises")
                    .long("no-raises")
                    .action(ArgAction::SetTrue),
            )
            .arg(Arg::new("config").long("config"))
    }

    /// A configuration file in the temporary directory, removed on drop.
    struct ScratchFile(PathBuf);

    impl ScratchFile {
        fn new(text: &str) -> Self {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "abissd-config-test-{}-{}.toml",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, text).unwrap();
            Self(path)
        }
    }

    impl Drop for ScratchFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    fn merged(text: &str, command_line: &[&str]) -> Result<Vec<String>, ConfigError> {
        let f = ScratchFile::new(text);
        merge(&command(), &f.0, true, &args(command_line))
            .map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect())
    }

    #[test]
    fn settings_become_arguments_and_the_command_line_wins() {
        let out = merged(
            "device = [\"sdb\", \"sdc\"]\ncapacity = \"30MB/s\"\nrealtime_share = 70\nno_raises = true\n",
            &["abissd", "--capacity", "40MB/s"],
        )
        .unwrap();
        assert_eq!(
            out,
            [
                "abissd",
                "--device",
                "sdb",
                "--device",
                "sdc",
                "--no-raises",
                "--realtime-share",
                "70",
                "--capacity",
                "40MB/s"
            ]
        );
        // Devices on the command line replace the file's list rather than adding to it.
        let out = merged("device = [\"sdb\"]\n", &["abissd", "--device", "sdd"]).unwrap();
        assert_eq!(out, ["abissd", "--device", "sdd"]);
    }

    /// A configuration written before the code said "raise" keeps working: its keys are the
    /// daemon's options' earlier names, which abissd still takes.
    #[test]
    fn an_earlier_name_of_a_setting_is_still_taken() {
        use clap::{CommandFactory as _, Parser as _};
        let f = ScratchFile::new("no_upgrades = true\nupgrade_idle = 7\n");
        let command = crate::args::Args::command();
        let merged = merge(&command, &f.0, true, &args(&["abissd"])).unwrap();
        let parsed = crate::args::Args::try_parse_from(&merged).unwrap();
        assert!(parsed.no_raises);
        assert_eq!(parsed.raise_idle, std::time::Duration::from_secs(7));
    }

    #[test]
    fn bad_settings_name_the_file_and_the_key() {
        let error = merged("realtime_share = 99\n", &["abissd"]).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("configuration file"), "{text}");
        assert!(text.contains("realtime-share"), "{text}");
        let error = merged("colour = \"blue\"\n", &["abissd"]).unwrap_err();
        assert!(
            error.to_string().contains("unknown setting `colour`"),
            "{error}"
        );
        let error = merged("config = \"/x\"\n", &["abissd"]).unwrap_err();
        assert!(
            error.to_string().contains("unknown setting `config`"),
            "{error}"
        );
        let error = merged("device = [[1]]\n", &["abissd"]).unwrap_err();
        assert!(error.to_string().contains("`device` must be"), "{error}");
        let error = merged("device = \n", &["abissd"]).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid { .. }), "{error}");
    }

    #[test]
    fn a_missing_default_file_is_no_error_but_a_missing_given_one_is() {
        let missing = Path::new("/nonexistent/abissd.toml");
        let line = args(&["abissd", "--device", "sdb"]);
        assert_eq!(merge(&command(), missing, false, &line).unwrap(), line);
        assert!(matches!(
            merge(&command(), missing, true, &line),
            Err(ConfigError::Read { .. })
        ));
    }
}
