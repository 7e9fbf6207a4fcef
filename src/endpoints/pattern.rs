//! Address patterns: the one rule for naming pods by address, shared by the subset hint, the
//! conformance test header and the candidate restriction. A pattern is `ip:port`, or a bare
//! `ip` (written as port 0) meaning any port of that IP; IPv6 may be bracketed.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// `ip:port`, or `ip` with any port (port 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressPattern(SocketAddr);

impl AddressPattern {
    /// Parses `ip:port` or a bare `ip` (any port); IPv6 may be bracketed.
    pub fn parse(s: &str) -> Option<AddressPattern> {
        let s = s.trim();
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Some(AddressPattern(a));
        }
        let bare = s.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<IpAddr>()
            .ok()
            .map(|ip| AddressPattern(SocketAddr::new(ip, 0)))
    }

    /// Parses a comma-separated list; entries that do not parse are skipped.
    pub fn parse_list(s: &str) -> Vec<AddressPattern> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .filter_map(AddressPattern::parse)
            .collect()
    }

    /// Whether the pattern names any port of its IP.
    pub fn any_port(&self) -> bool {
        self.0.port() == 0
    }

    /// The pattern as a socket address (port 0 when any port).
    pub fn addr(&self) -> SocketAddr {
        self.0
    }

    /// Whether `addr` is named by the pattern.
    pub fn matches(&self, addr: &SocketAddr) -> bool {
        self.0 == *addr || (self.any_port() && self.0.ip() == addr.ip())
    }

    /// The addresses both patterns name, as a pattern, if any.
    pub fn intersect(&self, other: &AddressPattern) -> Option<AddressPattern> {
        if self.0.ip() != other.0.ip() {
            return None;
        }
        match (self.any_port(), other.any_port()) {
            (true, _) => Some(*other),
            (_, true) => Some(*self),
            _ if self.0.port() == other.0.port() => Some(*self),
            _ => None,
        }
    }

    /// `patterns` narrowed to `by`: each kept as its intersection with the first of `by` it
    /// meets, dropped when it meets none.
    pub fn narrow(patterns: Vec<AddressPattern>, by: &[AddressPattern]) -> Vec<AddressPattern> {
        patterns
            .into_iter()
            .filter_map(|a| by.iter().find_map(|b| a.intersect(b)))
            .collect()
    }
}

impl From<SocketAddr> for AddressPattern {
    fn from(addr: SocketAddr) -> AddressPattern {
        AddressPattern(addr)
    }
}

impl fmt::Display for AddressPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.any_port() {
            write!(f, "{}", self.0.ip())
        } else {
            write!(f, "{}", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> AddressPattern {
        AddressPattern::parse(s).unwrap()
    }

    #[test]
    fn endpoint_lists() {
        assert_eq!(
            AddressPattern::parse_list("10.0.0.1:80, 10.0.0.2 ,[::1]:9,::2")
                .iter()
                .map(AddressPattern::addr)
                .collect::<Vec<_>>(),
            [
                "10.0.0.1:80".parse::<SocketAddr>().unwrap(),
                "10.0.0.2:0".parse().unwrap(),
                "[::1]:9".parse().unwrap(),
                "[::2]:0".parse().unwrap()
            ]
        );
        assert!(AddressPattern::parse_list("").is_empty());
    }

    #[test]
    fn a_bare_ip_matches_every_port_of_that_ip_only() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert!(p("10.0.0.1").matches(&a));
        assert!(p("[10.0.0.1]").matches(&a));
        assert!(p("10.0.0.1:80").matches(&a));
        assert!(!p("10.0.0.1:81").matches(&a));
        assert!(!p("10.0.0.2").matches(&a));
        assert_eq!(p("10.0.0.1").to_string(), "10.0.0.1");
        assert_eq!(p("[::1]:9").to_string(), "[::1]:9");
    }

    #[test]
    fn intersections() {
        for (a, b, both) in [
            ("10.0.0.1", "10.0.0.1:80", Some("10.0.0.1:80")),
            ("10.0.0.1:80", "10.0.0.1", Some("10.0.0.1:80")),
            ("10.0.0.1", "10.0.0.1", Some("10.0.0.1")),
            ("10.0.0.1:80", "10.0.0.1:80", Some("10.0.0.1:80")),
            ("10.0.0.1:80", "10.0.0.1:81", None),
            ("10.0.0.1", "10.0.0.2", None),
        ] {
            assert_eq!(p(a).intersect(&p(b)), both.map(p), "{a} and {b}");
        }
        assert_eq!(
            AddressPattern::narrow(
                AddressPattern::parse_list("10.0.0.1,10.0.0.2:5,10.0.0.3"),
                &AddressPattern::parse_list("10.0.0.1:7,10.0.0.2")
            ),
            AddressPattern::parse_list("10.0.0.1:7,10.0.0.2:5")
        );
    }
}
