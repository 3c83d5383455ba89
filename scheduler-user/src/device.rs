//! Managed block devices: elevator and dispatch depth while streams are active, restored on exit.
