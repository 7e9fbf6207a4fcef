//! A metric family as data: its name, help, labels and kind, declared once as a constant
//! ([`Family`]) and registered from that declaration ([`Family::register`]), which returns the
//! typed collector the code counts with.
//!
//! A label is free-form ([`Label::Free`]: a model, a pod; a series appears when first counted)
//! or enum-valued ([`Label::Enum`], or [`Label::Given`] when the registering caller knows the
//! values). The help lists each enum-valued label's values (`text (label: a, b)`, [`listing`]),
//! and when every label of a family is enum-valued, every combination of values exists at 0 from
//! the start ("none yet" is a value, not an absence; rates compare from the first event).

use prometheus::core::Collector;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use super::listing;

/// What a family measures, and so the collector that carries it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// An integer counter (`IntCounter`, `IntCounterVec`).
    Counter,
    /// An integer gauge (`IntGauge`, `IntGaugeVec`).
    Gauge,
    /// A float gauge: seconds, ratios (`Gauge`, `GaugeVec`).
    FloatGauge,
    /// A histogram with these bucket bounds (`Histogram`, `HistogramVec`).
    Histogram(&'static [f64]),
}

/// One label of a family.
#[derive(Debug, Clone, Copy)]
pub enum Label {
    /// Values the help does not list: free-form (a model, a pod), or a Kthena family's label
    /// (Kthena's help is kept as Kthena wrote it).
    Free(&'static str),
    /// An enum's values (its `as_str()`s), listed in the help.
    Enum(&'static str, fn() -> Vec<&'static str>),
    /// Values listed in the help that the caller gives ([`Family::register_with`]).
    Given(&'static str),
}

impl Label {
    pub fn name(&self) -> &'static str {
        match *self {
            Label::Free(name) | Label::Enum(name, _) | Label::Given(name) => name,
        }
    }
}

/// A metric family: what the exposition says of it.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub name: &'static str,
    /// The help text, before [`listing`] appends the enum-valued labels' values.
    pub help: &'static str,
    pub labels: &'static [Label],
    pub kind: Kind,
}

impl Family {
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [Label],
    ) -> Family {
        Family::new(name, help, labels, Kind::Counter)
    }

    pub const fn gauge(name: &'static str, help: &'static str, labels: &'static [Label]) -> Family {
        Family::new(name, help, labels, Kind::Gauge)
    }

    pub const fn float_gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [Label],
    ) -> Family {
        Family::new(name, help, labels, Kind::FloatGauge)
    }

    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [Label],
        buckets: &'static [f64],
    ) -> Family {
        Family::new(name, help, labels, Kind::Histogram(buckets))
    }

    const fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [Label],
        kind: Kind,
    ) -> Family {
        Family {
            name,
            help,
            labels,
            kind,
        }
    }

    /// The family's collector, registered into `registry`.
    pub fn register<C: Make>(&self, registry: &Registry) -> C {
        self.register_with(registry, &[])
    }

    /// [`Family::register`], with the values of the [`Label::Given`] labels in label order.
    pub fn register_with<C: Make>(&self, registry: &Registry, given: &[&[&str]]) -> C {
        let listed = self.listed(given);
        let collector = C::make(self, self.full_help(&listed));
        if !self.labels.is_empty() && listed.len() == self.labels.len() {
            for_each_combination(&listed, &mut Vec::new(), &mut |values| {
                collector.touch(values);
            });
        }
        registry
            .register(Box::new(collector.clone()))
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
        collector
    }

    /// The enum-valued labels and their values, in label order.
    fn listed<'a>(&self, given: &[&[&'a str]]) -> Vec<(&'static str, Vec<&'a str>)> {
        let mut given = given.iter();
        self.labels
            .iter()
            .filter_map(|label| match *label {
                Label::Free(_) => None,
                Label::Enum(name, values) => Some((name, values())),
                Label::Given(name) => {
                    let values = given.next().unwrap_or_else(|| {
                        panic!("{}: no values given for the label {name}", self.name)
                    });
                    Some((name, values.to_vec()))
                }
            })
            .collect()
    }

    /// The help as exported: the text, then the enum-valued labels' values ([`listing`]).
    fn full_help(&self, listed: &[(&str, Vec<&str>)]) -> String {
        if listed.is_empty() {
            return self.help.to_string();
        }
        let lists: Vec<(&str, &[&str])> = listed.iter().map(|(l, v)| (*l, v.as_slice())).collect();
        listing(self.help, &lists)
    }

    fn label_names(&self) -> Vec<&'static str> {
        self.labels.iter().map(Label::name).collect()
    }

    /// Panics unless the family is of `kind`, with labels exactly when `vec`: a declaration
    /// that does not match its collector is a programming error, found by any test that
    /// registers it.
    fn expect(&self, kind: Kind, vec: bool, collector: &str) {
        let same = std::mem::discriminant(&self.kind) == std::mem::discriminant(&kind);
        assert!(
            same && vec != self.labels.is_empty(),
            "{}: declared {:?} with {} labels, registered as {collector}",
            self.name,
            self.kind,
            self.labels.len(),
        );
    }

    fn opts(&self, help: String) -> Opts {
        Opts::new(self.name, help)
    }

    fn histogram_opts(&self, help: String) -> HistogramOpts {
        let buckets = match self.kind {
            Kind::Histogram(buckets) => buckets.to_vec(),
            _ => Vec::new(),
        };
        HistogramOpts::new(self.name, help).buckets(buckets)
    }
}

/// Calls `f` with every combination of the listed values, the first label's varying slowest.
fn for_each_combination<'a>(
    listed: &[(&str, Vec<&'a str>)],
    prefix: &mut Vec<&'a str>,
    f: &mut impl FnMut(&[&str]),
) {
    let Some(((_, values), rest)) = listed.split_first() else {
        f(prefix);
        return;
    };
    for value in values {
        prefix.push(value);
        for_each_combination(rest, prefix, f);
        prefix.pop();
    }
}

/// A collector made from a [`Family`].
pub trait Make: Collector + Clone + Sized + 'static {
    fn make(family: &Family, help: String) -> Self;
    /// Creates the series of these label values, at 0.
    fn touch(&self, _values: &[&str]) {}
}

impl Make for IntCounter {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::Counter, false, "IntCounter");
        IntCounter::with_opts(f.opts(help)).expect("valid metric")
    }
}

impl Make for IntCounterVec {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::Counter, true, "IntCounterVec");
        IntCounterVec::new(f.opts(help), &f.label_names()).expect("valid metric")
    }

    fn touch(&self, values: &[&str]) {
        self.with_label_values(values);
    }
}

impl Make for IntGauge {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::Gauge, false, "IntGauge");
        IntGauge::with_opts(f.opts(help)).expect("valid metric")
    }
}

impl Make for IntGaugeVec {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::Gauge, true, "IntGaugeVec");
        IntGaugeVec::new(f.opts(help), &f.label_names()).expect("valid metric")
    }

    fn touch(&self, values: &[&str]) {
        self.with_label_values(values);
    }
}

impl Make for Gauge {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::FloatGauge, false, "Gauge");
        Gauge::with_opts(f.opts(help)).expect("valid metric")
    }
}

impl Make for GaugeVec {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::FloatGauge, true, "GaugeVec");
        GaugeVec::new(f.opts(help), &f.label_names()).expect("valid metric")
    }

    fn touch(&self, values: &[&str]) {
        self.with_label_values(values);
    }
}

impl Make for Histogram {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::Histogram(&[]), false, "Histogram");
        Histogram::with_opts(f.histogram_opts(help)).expect("valid metric")
    }
}

impl Make for HistogramVec {
    fn make(f: &Family, help: String) -> Self {
        f.expect(Kind::Histogram(&[]), true, "HistogramVec");
        HistogramVec::new(f.histogram_opts(help), &f.label_names()).expect("valid metric")
    }

    fn touch(&self, values: &[&str]) {
        self.with_label_values(values);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{encode, listed};

    const THINGS: Family = Family::counter(
        "things_total",
        "Things, by kind and colour",
        &[Enum("kind", || vec!["a", "b"]), Given("colour")],
    );
    use Label::{Enum, Free, Given};

    #[test]
    fn every_combination_of_enum_values_exists_at_zero_and_is_listed() {
        let registry = Registry::new();
        let c: IntCounterVec = THINGS.register_with(&registry, &[&["red", "blue", "green"]]);
        c.with_label_values(&["b", "red"]).inc();
        let families = registry.gather();
        let family = &families[0];
        assert_eq!(family.get_metric().len(), 6);
        assert_eq!(
            family.help(),
            "Things, by kind and colour (kind: a, b; colour: red, blue, green)"
        );
        assert_eq!(listed(family.help())["colour"].len(), 3);
        let text = encode(&registry);
        assert!(text.contains("things_total{colour=\"green\",kind=\"a\"} 0"));
        assert!(text.contains("things_total{colour=\"red\",kind=\"b\"} 1"));
    }

    #[test]
    fn free_labels_are_neither_listed_nor_created() {
        const PER_MODEL: Family = Family::histogram(
            "per_model_seconds",
            "Time, by model and result",
            &[Free("model"), Enum("result", || vec!["ok", "error"])],
            &[0.5, 1.0],
        );
        let registry = Registry::new();
        let h: HistogramVec = PER_MODEL.register(&registry);
        assert!(
            registry.gather().is_empty(),
            "no series before one is counted"
        );
        h.with_label_values(&["m", "ok"]).observe(0.7);
        let text = encode(&registry);
        assert!(
            text.contains("# HELP per_model_seconds Time, by model and result (result: ok, error)")
        );
        assert!(text.contains("per_model_seconds_bucket{model=\"m\",result=\"ok\",le=\"0.5\"} 0"));
        assert!(text.contains("per_model_seconds_bucket{model=\"m\",result=\"ok\",le=\"1\"} 1"));
    }

    #[test]
    #[should_panic(
        expected = "things_total: declared Counter with 2 labels, registered as IntGauge"
    )]
    fn a_declaration_that_does_not_match_its_collector_panics() {
        let _: IntGauge = THINGS.register_with(&Registry::new(), &[&["red"]]);
    }

    #[test]
    #[should_panic(expected = "things_total: no values given for the label colour")]
    fn given_labels_need_their_values() {
        let _: IntCounterVec = THINGS.register(&Registry::new());
    }
}
