//! Tasks a raised thread made while no abissd ran. While abissd runs, the fork program tells it
//! of every task a raised thread makes, and it puts each back at once ([`super::forks`]). Killed,
//! it hears nothing: a raised thread that forks or starts a thread before the next start hands
//! its raise on (a new task takes its maker's I/O priority), and the record of raises names
//! only the threads abissd raised. So the next start, after putting those back, puts back the
//! tasks that descend from a recorded thread's process, started after its raise, and still
//! have exactly the priority it was raised to. A process under the recorded process id that
//! started after the raise is another one (the id came round again): nothing of it is touched.

use std::collections::{HashMap, HashSet};

use abiss_os::ioprio;
use scheduler_common::MonotonicNs;

use crate::policy::raise::Raise;

/// How far up the parents a task is looked at for a raised process (a task deeper than that
/// is not put back; a chain of forks that long in the seconds abissd was down is no player's).
const MAX_GENERATIONS: usize = 64;

/// A task as `/proc` shows it.
struct Task {
    tid: u32,
    tgid: u32,
    /// Clock ticks after boot.
    start_ticks: u64,
}

/// Puts back the tasks that the threads of `raises` (those an earlier daemon left) made
/// since their raise; how many it put back.
pub(super) fn put_back(raises: &[Raise]) -> usize {
    let raises: Vec<&Raise> = raises.iter().filter(|r| !r.journal).collect();
    if raises.is_empty() {
        return 0;
    }
    let (tasks, processes) = all_tasks();
    let recorded: HashSet<u32> = raises.iter().map(|r| r.task.pid).collect();
    let ticks = procfs::ticks_per_second();
    let mut put_back = 0;
    for task in tasks.iter().filter(|t| !recorded.contains(&t.tid)) {
        // From `/proc` alone first: the priority is asked only of the raised processes'
        // descendants, not of every task on the machine.
        let mut candidates = raises.iter().filter(|raise| {
            let raised_at = ticks_of(raise.raised_at, ticks);
            task.start_ticks >= raised_at
                && processes
                    .get(&raise.tgid)
                    .is_some_and(|process| process.start_ticks <= raised_at)
                && descends_from(task.tgid, raise.tgid, &processes)
        });
        let Some(first) = candidates.next() else {
            continue;
        };
        let Ok(now) = ioprio::get(task.tid) else {
            continue;
        };
        let made_by = std::iter::once(first)
            .chain(candidates)
            .find(|raise| now == raise.applied);
        if let Some(raise) = made_by {
            if ioprio::set(task.tid, raise.previous).is_ok() {
                put_back += 1;
            }
        }
    }
    put_back
}

/// A process as `/proc` shows it.
struct Process {
    parent: u32,
    /// Clock ticks after boot.
    start_ticks: u64,
}

/// Every task of the machine, and every process by id.
fn all_tasks() -> (Vec<Task>, HashMap<u32, Process>) {
    let mut tasks = Vec::new();
    let mut by_id = HashMap::new();
    let Ok(processes) = procfs::process::all_processes() else {
        return (tasks, by_id);
    };
    for process in processes.flatten() {
        let Ok(stat) = process.stat() else {
            continue;
        };
        let (Ok(tgid), Ok(parent)) = (u32::try_from(stat.pid), u32::try_from(stat.ppid)) else {
            continue;
        };
        by_id.insert(
            tgid,
            Process {
                parent,
                start_ticks: stat.starttime,
            },
        );
        let Ok(threads) = process.tasks() else {
            continue;
        };
        for thread in threads.flatten() {
            let (Ok(thread_id), Ok(thread_stat)) = (u32::try_from(thread.tid), thread.stat())
            else {
                continue;
            };
            tasks.push(Task {
                tid: thread_id,
                tgid,
                start_ticks: thread_stat.starttime,
            });
        }
    }
    (tasks, by_id)
}

/// `time` in clock ticks after boot, rounded down. (`CLOCK_MONOTONIC` stops in suspend, and a
/// task's start time does not: a task that started after `time` always has a start time at or
/// after this.)
fn ticks_of(time: MonotonicNs, ticks_per_second: u64) -> u64 {
    u64::try_from(u128::from(time.0) * u128::from(ticks_per_second) / 1_000_000_000)
        .unwrap_or(u64::MAX)
}

/// Whether process `tgid` is `ancestor` or descends from it.
fn descends_from(tgid: u32, ancestor: u32, processes: &HashMap<u32, Process>) -> bool {
    let mut at = tgid;
    for _ in 0..MAX_GENERATIONS {
        if at == ancestor {
            return true;
        }
        match processes.get(&at) {
            Some(process) if process.parent > 1 => at = process.parent,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_descends_from_itself_and_its_forebears_but_not_past_init() {
        let of = |pairs: &[(u32, u32)]| -> HashMap<u32, Process> {
            pairs
                .iter()
                .map(|&(pid, parent)| {
                    (
                        pid,
                        Process {
                            parent,
                            start_ticks: 0,
                        },
                    )
                })
                .collect()
        };
        let processes = of(&[(30, 20), (20, 10), (10, 1), (40, 1)]);
        assert!(descends_from(30, 30, &processes));
        assert!(descends_from(30, 10, &processes));
        assert!(!descends_from(10, 30, &processes));
        assert!(!descends_from(40, 10, &processes));
        assert!(!descends_from(30, 1, &processes));
        assert!(!descends_from(5, 7, &of(&[(5, 6), (6, 5)])));
    }

    #[test]
    fn a_raise_time_in_ticks_is_rounded_down() {
        assert_eq!(ticks_of(MonotonicNs(1_999_999_999), 100), 199);
        assert_eq!(ticks_of(MonotonicNs(2_000_000_000), 100), 200);
        assert_eq!(ticks_of(MonotonicNs(u64::MAX), u64::MAX), u64::MAX);
    }
}
