//! The one kind of benchmark row, and the one way to pick rows. Every benchmark names what it
//! compares as rows (an elevator and readers' class, a load, a budget, a situation of abissd, a
//! player setup …), runs those named in `--rows` (or its default rows), and reports each as a
//! [`Row`]: its name, what it ran, and what it measured. The machine and the conditions every
//! row shares are the report's own ([`crate::report::Results`]).

use serde::Serialize;

/// One row of a benchmark's results.
#[derive(Clone, Debug, Serialize)]
pub struct Row<C, F> {
    /// The row's name, as `--rows` takes it.
    pub name: String,
    /// What the row ran (elevator, class, hooks, load, budget …).
    pub configuration: C,
    /// What it measured.
    pub figures: F,
}

impl<C, F> Row<C, F> {
    /// The row `name`, of `configuration`, that measured `figures`.
    pub fn new(name: impl Into<String>, configuration: C, figures: F) -> Self {
        Self {
            name: name.into(),
            configuration,
            figures,
        }
    }
}

/// The `--rows` flag every benchmark takes.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct RowsArg {
    /// Rows to run, by name, in the benchmark's order (default: its default rows; an unknown
    /// name lists the known ones), e.g. `--rows bfq,bfq-rt`.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
}

impl RowsArg {
    /// The rows of `all` named in `--rows`, in `all`'s order; with no `--rows`, those of `all`
    /// for which `by_default` holds (rows run only on request are left out). A name that is no
    /// row is an error that lists the known ones.
    pub fn select<R>(
        &self,
        all: Vec<R>,
        name: impl Fn(&R) -> &str,
        by_default: impl Fn(&R) -> bool,
    ) -> anyhow::Result<Vec<R>> {
        if let Some(unknown) = self
            .rows
            .iter()
            .find(|n| !all.iter().any(|r| name(r) == n.as_str()))
        {
            let known: Vec<&str> = all.iter().map(&name).collect();
            anyhow::bail!("unknown row {unknown:?}; known: {}", known.join(", "));
        }
        Ok(all
            .into_iter()
            .filter(|r| {
                if self.rows.is_empty() {
                    by_default(r)
                } else {
                    self.rows.iter().any(|n| n == name(r))
                }
            })
            .collect())
    }

    /// [`Self::select`], less the rows whose elevator this kernel lacks (said on stderr; an
    /// error for a row named in `--rows`).
    pub fn select_present<R>(
        &self,
        all: Vec<R>,
        name: impl Fn(&R) -> &str,
        by_default: impl Fn(&R) -> bool,
        elevator: impl Fn(&R) -> &str,
    ) -> anyhow::Result<Vec<R>> {
        let rows = self.select(all, &name, by_default)?;
        crate::lab_disk::with_elevators_present(rows, &self.rows, name, elevator)
    }
}

/// Every row runs by default.
#[must_use]
pub fn always<R>(_: &R) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(names: &[&str]) -> RowsArg {
        RowsArg {
            rows: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    #[test]
    fn rows_are_picked_in_the_benchmarks_order_and_unknown_names_are_refused() {
        let all = || vec![("a", true), ("b", false), ("c", true)];
        let picked = arg(&["c", "b"]).select(all(), |r| r.0, |r| r.1).unwrap();
        assert_eq!(picked, [("b", false), ("c", true)]);
        // By default, the rows run only on request are left out.
        let default = arg(&[]).select(all(), |r| r.0, |r| r.1).unwrap();
        assert_eq!(default, [("a", true), ("c", true)]);
        let error = arg(&["d"]).select(all(), |r| r.0, |r| r.1).unwrap_err();
        assert_eq!(error.to_string(), "unknown row \"d\"; known: a, b, c");
    }

    #[test]
    fn a_row_is_written_as_name_configuration_and_figures() {
        let row = Row::new("bfq", serde_json::json!({"elevator": "bfq"}), 3);
        assert_eq!(
            serde_json::to_value(&row).unwrap(),
            serde_json::json!({"name": "bfq", "configuration": {"elevator": "bfq"}, "figures": 3})
        );
    }
}
