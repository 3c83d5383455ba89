//! The name table (`scheduler_common::names`) is the built object's: every map and program the
//! eBPF crate made is in it and nothing else, and every program the daemon attaches, required
//! or optional, is one of them.

use std::collections::BTreeSet;

use abiss_kernel::capabilities::Feature;
use scheduler_common::names::{MAPS, PROGRAMS};

use super::{BLOCK_PROGRAMS, EBPF_OBJECT, FORK_PROGRAM};

#[test]
fn the_name_table_is_the_built_objects() {
    let object = aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded eBPF object parses");
    // Global data (`.rodata`, `.bss`) is a map of its section's name, not one of the table's.
    let maps: BTreeSet<&str> = object
        .maps
        .keys()
        .map(String::as_str)
        .filter(|name| !name.starts_with('.'))
        .collect();
    assert_eq!(maps, MAPS.into_iter().collect::<BTreeSet<_>>());
    let programs: BTreeSet<&str> = object.programs.keys().map(String::as_str).collect();
    assert_eq!(programs, PROGRAMS.into_iter().collect::<BTreeSet<_>>());
}

#[test]
fn every_program_the_daemon_attaches_is_in_the_table() {
    let mut attached: Vec<&str> = BLOCK_PROGRAMS.iter().map(|(name, _)| *name).collect();
    attached.push(FORK_PROGRAM.0);
    for feature in Feature::ALL {
        attached.extend(feature.programs().iter().map(|(name, _)| *name));
        if let Some((stand_ins, _)) = feature.stand_in() {
            attached.extend(stand_ins.iter().map(|(name, _)| *name));
        }
    }
    let attached: BTreeSet<&str> = attached.into_iter().collect();
    assert_eq!(attached, PROGRAMS.into_iter().collect::<BTreeSet<_>>());
}
