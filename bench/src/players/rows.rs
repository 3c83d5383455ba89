//! The benchmark's rows: who plays what, how, under which load, and which run when none are
//! named.

use super::{Class, Configuration, Scenario};

/// A row with no `abissctl run` options.
fn row(
    name: &'static str,
    description: &'static str,
    elevator: &'static str,
    class: Class,
    scenario: Scenario,
) -> Configuration {
    Configuration {
        name,
        description,
        elevator,
        class,
        scenario,
        run_options: &[],
        daemon_options: &[],
        no_load: false,
        warm: false,
    }
}

/// Four players under `abissctl run` with `run_options`.
fn abiss_with(
    name: &'static str,
    description: &'static str,
    run_options: &'static [&'static str],
) -> Configuration {
    Configuration {
        run_options,
        ..row(
            name,
            description,
            "mq-deadline",
            Class::Abiss,
            Scenario::Four,
        )
    }
}

/// The rows without the load: the floor a cold start costs the disk, and the floor starting
/// the players at once costs the machine with their files in memory.
fn no_load_rows() -> Vec<Configuration> {
    let no_load = |row: Configuration| Configuration {
        no_load: true,
        ..row
    };
    vec![
        Configuration {
            warm: true,
            ..no_load(row(
                "mq-deadline-warm-no-load",
                "stock mq-deadline, no best-effort load, the files in memory: what starting the \
                 players at once costs the CPUs",
                "mq-deadline",
                Class::Default,
                Scenario::Four,
            ))
        },
        no_load(row(
            "mq-deadline-no-load",
            "stock mq-deadline, no best-effort load: the cold start-up's floor",
            "mq-deadline",
            Class::Default,
            Scenario::Four,
        )),
        no_load(abiss_with(
            "abiss-preroll-no-load",
            "abiss, abissctl run --preroll 6MiB, no best-effort load",
            &["--preroll", "6MiB"],
        )),
        Configuration {
            run_options: &["--preroll", "6MiB"],
            ..no_load(row(
                "abiss-seek-no-load",
                "abiss, abissctl run --preroll 6MiB, gst seeking every 10 s, no best-effort \
                 load: the seeks' and the start-ups' floor",
                "mq-deadline",
                Class::Abiss,
                Scenario::FourOneSeeking,
            ))
        },
        Configuration {
            run_options: &["--preroll", "6MiB"],
            ..no_load(row(
                "abiss-8-viewers-no-load",
                "abiss, abissctl run --preroll 6MiB, 8 viewers of one file, no best-effort \
                 load: the floor of 8 start-ups at 8 points of one file at once",
                "mq-deadline",
                Class::Abiss,
                Scenario::EightViewers,
            ))
        },
        Configuration {
            run_options: &["--preroll", "6MiB"],
            ..no_load(row(
                "abiss-8-players-no-load",
                "abiss, abissctl run --preroll 6MiB, 8 players of 8 files, no best-effort load: \
                 the floor of 8 cold start-ups at once",
                "mq-deadline",
                Class::Abiss,
                Scenario::EightFiles,
            ))
        },
        Configuration {
            daemon_options: &["--dispatch-depth", "8"],
            ..no_load(abiss_with(
                "abiss-preroll-depth-8-no-load",
                "abiss at the dispatch depth it gave rotational disks until 2026-12-07 \
                 (abissd --dispatch-depth 8), abissctl run --preroll 6MiB, no best-effort load",
                &["--preroll", "6MiB"],
            ))
        },
    ]
}

/// Whether `row` runs when no rows are named: all but the experiments with abissd's own
/// options (the dispatch depth) and on the CPUs' share of a start ([`cpu_rows`]), which run
/// when named.
pub(super) fn by_default(row: &Configuration) -> bool {
    row.daemon_options.is_empty() && !cpu_rows().iter().any(|cpu| cpu.name == row.name)
}

/// 8 players of 8 files under abiss with their files in memory, with and without the load:
/// what the load adds to a start that reads nothing from the lab disk (the CPUs, the players'
/// own files on the root disk).
fn cpu_rows() -> [Configuration; 2] {
    let warm = |name, description, no_load| Configuration {
        run_options: &["--preroll", "6MiB"],
        warm: true,
        no_load,
        ..row(
            name,
            description,
            "mq-deadline",
            Class::Abiss,
            Scenario::EightFiles,
        )
    };
    [
        warm(
            "abiss-8-players-warm-no-load",
            "abiss, abissctl run --preroll 6MiB, 8 players of 8 files in memory, no best-effort \
             load",
            true,
        ),
        warm(
            "abiss-8-players-warm",
            "abiss, abissctl run --preroll 6MiB, 8 players of 8 files in memory, under the load: \
             what the load adds with nothing to read from the lab disk",
            false,
        ),
    ]
}

/// Every row, in report order.
#[must_use]
pub fn all_rows() -> Vec<Configuration> {
    use Class::{Default, RealTime};
    use Scenario::Four;
    let loaded = vec![
        row(
            "mq-deadline",
            "stock mq-deadline",
            "mq-deadline",
            Default,
            Four,
        ),
        row("bfq", "stock bfq", "bfq", Default, Four),
        row(
            "bfq-rt",
            "bfq, players in ionice -c1",
            "bfq",
            RealTime,
            Four,
        ),
        abiss_with(
            "abiss",
            "abissd (mq-deadline), players under abissctl run (buffers sized by abissd)",
            &[],
        ),
        abiss_with(
            "abiss-fixed",
            "abiss, abissctl run --buffer 564KiB (the default before abissd sized buffers)",
            &["--buffer", "564KiB"],
        ),
        abiss_with(
            "abiss-6MiB",
            "abiss, abissctl run --buffer 6MiB: room for the players' start-up reads",
            &["--buffer", "6MiB"],
        ),
        abiss_with(
            "abiss-preroll",
            "abiss, abissctl run --preroll 6MiB: the players' start-up reads loaded at once",
            &["--preroll", "6MiB"],
        ),
    ];
    no_load_rows()
        .into_iter()
        .chain(loaded)
        .chain(seek_and_viewer_rows())
        .chain(depth_rows())
        .chain(arriving_rows())
        .chain(eight_player_rows())
        .chain(cpu_rows())
        .collect()
}

/// One player seeking every 10 s, and 8 viewers of one file, with the load.
fn seek_and_viewer_rows() -> [Configuration; 4] {
    use Class::{Abiss, Default};
    use Scenario::{EightViewers, FourOneSeeking};
    [
        row(
            "mq-deadline-seek",
            "stock mq-deadline, gst seeking every 10 s",
            "mq-deadline",
            Default,
            FourOneSeeking,
        ),
        Configuration {
            run_options: &["--preroll", "6MiB"],
            ..row(
                "abiss-seek",
                "abiss, abissctl run --preroll 6MiB, gst seeking every 10 s",
                "mq-deadline",
                Abiss,
                FourOneSeeking,
            )
        },
        row(
            "mq-deadline-8-viewers",
            "stock mq-deadline, 8 viewers of one file",
            "mq-deadline",
            Default,
            EightViewers,
        ),
        Configuration {
            run_options: &["--preroll", "6MiB"],
            ..row(
                "abiss-8-viewers",
                "abiss, abissctl run --preroll 6MiB, 8 viewers of one file",
                "mq-deadline",
                Abiss,
                EightViewers,
            )
        },
    ]
}

/// abiss at the dispatch depth it gave rotational disks before (8, now 4 there), with the
/// load: twice the best effort a start-up waits behind (its no-load floor is among
/// [`no_load_rows`]).
fn depth_rows() -> [Configuration; 1] {
    [Configuration {
        daemon_options: &["--dispatch-depth", "8"],
        ..abiss_with(
            "abiss-preroll-depth-8",
            "abiss at the dispatch depth it gave rotational disks until 2026-12-07 \
             (abissd --dispatch-depth 8), abissctl run --preroll 6MiB: twice the best effort a \
             start-up waits behind",
            &["--preroll", "6MiB"],
        )
    }]
}

/// The rows whose players arrive one by one.
fn arriving_rows() -> [Configuration; 2] {
    [
        row(
            "mq-deadline-arriving",
            "stock mq-deadline, players launched 5 s apart",
            "mq-deadline",
            Class::Default,
            Scenario::FourArriving,
        ),
        Configuration {
            run_options: &["--preroll", "6MiB"],
            ..row(
                "abiss-arriving",
                "abiss, abissctl run --preroll 6MiB, players launched 5 s apart",
                "mq-deadline",
                Class::Abiss,
                Scenario::FourArriving,
            )
        },
    ]
}

/// The rows of 8 players of 8 files started together (their no-load floor is among
/// [`no_load_rows`]).
fn eight_player_rows() -> [Configuration; 2] {
    [
        row(
            "mq-deadline-8-players",
            "stock mq-deadline, 8 players of 8 files",
            "mq-deadline",
            Class::Default,
            Scenario::EightFiles,
        ),
        Configuration {
            run_options: &["--preroll", "6MiB"],
            ..row(
                "abiss-8-players",
                "abiss, abissctl run --preroll 6MiB, 8 players of 8 files",
                "mq-deadline",
                Class::Abiss,
                Scenario::EightFiles,
            )
        },
    ]
}
