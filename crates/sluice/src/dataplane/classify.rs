//! Rule compiler: turns a config's match rules into the gate's lookup tables,
//! so classifying a packet costs one array lookup (plus one LPM lookup where
//! source prefixes apply) whatever the number of rules.
//!
//! Semantics: the first rule that matches, in config order (classes in file
//! order, then each class's rules in order), decides the class; IP traffic
//! that no rule matches goes to the default class. A rule without ports also
//! matches port-less packets of its protocol (non-first fragments); a rule
//! with ports never does.
//!
//! Tables (see `bpf/sluice.h`): `cells[slot * 65536 + port]` holds the class of
//! the first matching rule without a source prefix; if rules with a source
//! prefix come before it, the cell also names a prefix group, and the tries
//! map (group, source prefix) to the class of the first rule whose prefix
//! contains that prefix. A packet's longest matching prefix P in its group
//! stands for every rule prefix that contains the source address (they all
//! contain P), which is what makes one LPM lookup exact.
use std::collections::HashMap;
use std::net::IpAddr;

use crate::bpf_intf::{
    sluice_cell, sluice_v4_key, sluice_v6_key, SLUICE_CELLS, SLUICE_CELL_PREFIX, SLUICE_MAX_PREFIX_ENTRIES,
    SLUICE_PORTS_PER_SLOT, SLUICE_SLOT_PORTLESS, SLUICE_SLOT_TCP, SLUICE_SLOT_UDP,
};
use crate::policy::config::{Config, Prefix, Proto, Rule};

/// Too many (group, prefix) combinations for the tries.
#[derive(Debug, thiserror::Error)]
#[error("the rules need {needed} source-prefix table entries; at most {max} fit: use fewer overlapping port ranges with source prefixes")]
pub struct TooManyPrefixes {
    pub needed: usize,
    pub max: usize,
}

/// The compiled tables, ready to write into the gate's maps.
#[derive(Debug, Clone)]
pub struct Tables {
    /// One entry per (slot, port): SLUICE_CELLS entries.
    pub cells: Vec<sluice_cell>,
    pub v4: Vec<(sluice_v4_key, u32)>,
    pub v6: Vec<(sluice_v6_key, u32)>,
    pub groups: usize,
}

/// A packet as the classifier sees it (for the reference lookups and tests).
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub slot: u32,
    /// Destination port, or the IP protocol in the port-less slot.
    pub port: u16,
    pub src: IpAddr,
}

/// (slot, inclusive interval) a rule covers in the cell table.
fn rule_spans(rule: &Rule) -> Vec<(u32, u32, u32)> {
    let all = (0u32, 65535u32);
    let mut out = Vec::new();
    let ports = rule.ports.map_or(all, |(a, b)| (a as u32, b as u32));
    match rule.proto {
        Proto::Any => {
            out.push((SLUICE_SLOT_UDP, ports.0, ports.1));
            out.push((SLUICE_SLOT_TCP, ports.0, ports.1));
            if rule.ports.is_none() {
                out.push((SLUICE_SLOT_PORTLESS, 0, 255));
            }
        }
        Proto::Udp | Proto::Tcp => {
            let (slot, num) = if rule.proto == Proto::Udp { (SLUICE_SLOT_UDP, 17) } else { (SLUICE_SLOT_TCP, 6) };
            out.push((slot, ports.0, ports.1));
            if rule.ports.is_none() {
                out.push((SLUICE_SLOT_PORTLESS, num, num));
            }
        }
        Proto::Number(n) => out.push((SLUICE_SLOT_PORTLESS, n as u32, n as u32)),
    }
    out
}

/// Compile a config's rules into the gate's tables.
pub fn compile(cfg: &Config) -> Result<Tables, TooManyPrefixes> {
    // All rules in config order, with their class.
    let rules: Vec<(usize, &Rule)> =
        cfg.classes.iter().enumerate().flat_map(|(id, c)| c.rules.iter().map(move |r| (id, r))).collect();
    let default = sluice_cell { class_id: cfg.default_class as u8, flags: 0, group: 0 };
    let mut cells = vec![default; SLUICE_CELLS as usize];
    let mut groups: HashMap<Vec<usize>, u16> = HashMap::new();
    let (mut v4, mut v6) = (Vec::new(), Vec::new());

    for slot in [SLUICE_SLOT_UDP, SLUICE_SLOT_TCP, SLUICE_SLOT_PORTLESS] {
        // Spans of each rule in this slot, then the elementary intervals between all span edges.
        let spans: Vec<(usize, u32, u32)> = rules
            .iter()
            .enumerate()
            .flat_map(|(i, (_, r))| rule_spans(r).into_iter().filter(|s| s.0 == slot).map(move |s| (i, s.1, s.2)))
            .collect();
        let mut edges: Vec<u32> = spans.iter().flat_map(|&(_, a, b)| [a, b + 1]).collect();
        edges.extend([0, SLUICE_PORTS_PER_SLOT]);
        edges.sort_unstable();
        edges.dedup();
        for w in edges.windows(2) {
            let (lo, hi) = (w[0], w[1] - 1);
            // Rules covering [lo, hi], in config order (span indexes are in rule order).
            let mut covering: Vec<usize> =
                spans.iter().filter(|&&(_, a, b)| a <= lo && hi <= b).map(|&(i, _, _)| i).collect();
            covering.dedup();
            if covering.is_empty() {
                continue;
            }
            let first_plain = covering.iter().position(|&i| rules[i].1.src.is_none());
            let fallback = first_plain.map_or(cfg.default_class, |p| rules[covering[p]].0);
            let prefixed: Vec<usize> = covering[..first_plain.unwrap_or(covering.len())].to_vec();
            let mut cell = sluice_cell { class_id: fallback as u8, flags: 0, group: 0 };
            if !prefixed.is_empty() {
                let next = groups.len() as u16;
                let group = *groups.entry(prefixed.clone()).or_insert_with(|| {
                    add_group(next, &prefixed, &rules, &mut v4, &mut v6);
                    next
                });
                cell.flags = SLUICE_CELL_PREFIX as u8;
                cell.group = group;
            }
            let base = (slot * SLUICE_PORTS_PER_SLOT) as usize;
            cells[base + lo as usize..=base + hi as usize].fill(cell);
        }
    }
    let needed = v4.len().max(v6.len());
    if needed > SLUICE_MAX_PREFIX_ENTRIES as usize {
        return Err(TooManyPrefixes { needed, max: SLUICE_MAX_PREFIX_ENTRIES as usize });
    }
    Ok(Tables { cells, v4, v6, groups: groups.len() })
}

/// Trie entries of one prefix group: each distinct prefix maps to the class
/// of the first rule (in order) whose prefix contains it.
fn add_group(
    group: u16,
    prefixed: &[usize],
    rules: &[(usize, &Rule)],
    v4: &mut Vec<(sluice_v4_key, u32)>,
    v6: &mut Vec<(sluice_v6_key, u32)>,
) {
    let mut prefixes: Vec<Prefix> = prefixed.iter().filter_map(|&i| rules[i].1.src).collect();
    prefixes.sort();
    prefixes.dedup();
    for p in prefixes {
        let (class, _) = prefixed
            .iter()
            .map(|&i| rules[i])
            .find(|(_, r)| r.src.is_some_and(|s| s.contains(&p)))
            .expect("the rule that brought the prefix contains it");
        let prefixlen = 32 + p.len as u32;
        match p.addr {
            IpAddr::V4(a) => v4.push((
                sluice_v4_key { prefixlen, group: (group as u32).to_be(), addr: u32::from(a).to_be() },
                class as u32,
            )),
            IpAddr::V6(a) => {
                v6.push((sluice_v6_key { prefixlen, group: (group as u32).to_be(), addr: a.octets() }, class as u32))
            }
        }
    }
}

impl Tables {
    /// The class the gate will pick, computed from the tables the same way the
    /// BPF program does (array cell, then longest-prefix match in the group).
    pub fn lookup(&self, p: &Probe) -> usize {
        let cell = self.cells[(p.slot * SLUICE_PORTS_PER_SLOT) as usize + p.port as usize];
        if cell.flags & SLUICE_CELL_PREFIX as u8 == 0 {
            return cell.class_id as usize;
        }
        // Every trie entry of the cell's group as (prefix, class), then the longest that contains the source.
        let group = (cell.group as u32).to_be();
        let v4 = self.v4.iter().filter(|(k, _)| k.group == group).map(|(k, c)| {
            (Prefix { addr: IpAddr::V4(u32::from_be(k.addr).into()), len: (k.prefixlen - 32) as u8 }, *c)
        });
        let v6 = self
            .v6
            .iter()
            .filter(|(k, _)| k.group == group)
            .map(|(k, c)| (Prefix { addr: IpAddr::V6(k.addr.into()), len: (k.prefixlen - 32) as u8 }, *c));
        let host = Prefix { addr: p.src, len: if p.src.is_ipv4() { 32 } else { 128 } };
        let best = v4.chain(v6).filter(|(pre, _)| pre.contains(&host)).max_by_key(|(pre, _)| pre.len).map(|(_, c)| c);
        best.map_or(cell.class_id as usize, |c| c as usize)
    }
}

/// The class a packet gets by the definition: the first rule in config order
/// that matches. Slow and obvious; the tests check `compile` against it.
pub fn first_match(cfg: &Config, p: &Probe) -> usize {
    for (id, class) in cfg.classes.iter().enumerate() {
        for r in &class.rules {
            let covers = rule_spans(r).iter().any(|&(s, a, b)| s == p.slot && a <= p.port as u32 && p.port as u32 <= b);
            let host = Prefix { addr: p.src, len: if p.src.is_ipv4() { 32 } else { 128 } };
            if covers && r.src.is_none_or(|s| s.contains(&host)) {
                return id;
            }
        }
    }
    cfg.default_class
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config::{from_toml, parse_class_flag, parse_prefix, Class, Limit};
    use rand::{Rng, SeedableRng};
    use std::path::Path;

    fn probe(slot: u32, port: u16, src: &str) -> Probe {
        Probe { slot, port, src: src.parse().unwrap() }
    }

    #[test]
    fn ports_ranges_protocols_and_default() {
        let cfg = from_toml(
            r#"
[[class]]
name = "dns"
match = [{ proto = "udp", port = 53 }]
[[class]]
name = "web"
match = [{ proto = "tcp", port = "80-443" }]
[[class]]
name = "ping"
match = [{ proto = "icmp" }, { proto = "icmpv6" }]
[[class]]
name = "udp-rest"
match = [{ proto = "udp" }]
"#,
            Path::new("t"),
        )
        .unwrap();
        let t = compile(&cfg).unwrap();
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 53, "1.2.3.4")), 0);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_TCP, 80, "1.2.3.4")), 1);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_TCP, 443, "::1")), 1);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_TCP, 444, "::1")), cfg.default_class);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_PORTLESS, 1, "1.2.3.4")), 2);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_PORTLESS, 58, "::1")), 2);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 54, "1.2.3.4")), 3, "udp without ports catches the rest");
        // A UDP non-first fragment (port-less, proto 17) matches the port-less UDP rule, not the port 53 rule.
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_PORTLESS, 17, "1.2.3.4")), 3);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_PORTLESS, 6, "1.2.3.4")), cfg.default_class);
        assert_eq!(t.groups, 0);
    }

    #[test]
    fn nested_prefixes_first_match() {
        let cfg = from_toml(
            r#"
[[class]]
name = "trusted"
match = [{ proto = "udp", port = "1000-2000", src = "10.1.0.0/16" }]
[[class]]
name = "blocked-net"
rate = "blocked"
match = [{ proto = "udp", src = "10.0.0.0/8" }, { proto = "udp", src = "2001:db8::/32" }]
[[class]]
name = "app"
match = [{ proto = "udp", port = 1500 }]
"#,
            Path::new("t"),
        )
        .unwrap();
        let t = compile(&cfg).unwrap();
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 1500, "10.1.2.3")), 0);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 1500, "10.2.2.3")), 1);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 1500, "192.0.2.1")), 2);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 999, "10.1.2.3")), 1, "outside the trusted range");
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 999, "2001:db8::1")), 1);
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 999, "2001:db9::1")), cfg.default_class);
        assert!(t.groups >= 2);
    }

    fn random_rule(rng: &mut impl Rng) -> Rule {
        let proto = match rng.gen_range(0..5) {
            0 => Proto::Any,
            1 | 2 => Proto::Udp,
            3 => Proto::Tcp,
            _ => Proto::Number(rng.gen_range(0..4)),
        };
        let ports = (matches!(proto, Proto::Udp | Proto::Tcp) && rng.gen_bool(0.7)).then(|| {
            let a = rng.gen_range(0..40u16);
            (a, a + rng.gen_range(0..10))
        });
        let src = rng.gen_bool(0.4).then(|| {
            let len = rng.gen_range(0..=3u8) * 8;
            if rng.gen_bool(0.7) {
                let a = u32::from_be_bytes([10, rng.gen_range(0..2), rng.gen_range(0..2), 0]);
                Prefix { addr: IpAddr::V4((a & (u32::MAX.checked_shl(32 - len as u32).unwrap_or(0))).into()), len }
            } else {
                parse_prefix(if len >= 16 { "2001:db8::/32" } else { "::/0" }).unwrap()
            }
        });
        Rule { proto, ports, src }
    }

    /// The compiled tables agree with the first-match definition on random rule sets.
    #[test]
    fn compiled_tables_equal_first_match() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..200 {
            let classes: Vec<Class> = (0..rng.gen_range(1..6))
                .map(|i| Class {
                    name: format!("c{i}"),
                    priority: 1,
                    limit: Limit::Unlimited,
                    rules: (0..rng.gen_range(1..4)).map(|_| random_rule(&mut rng)).collect(),
                    discovered: None,
                    readers: None,
                    away: false,
                    syn_cookies: crate::policy::config::SynCookies::Auto,
                })
                .collect();
            let mut cfg = crate::policy::config::from_flags(&["x:match=udp".into()]).unwrap();
            cfg.classes = classes;
            cfg.classes.push(parse_class_flag("default").unwrap());
            cfg.default_class = cfg.classes.len() - 1;
            let t = compile(&cfg).unwrap();
            for _ in 0..300 {
                let slot = rng.gen_range(0..3);
                let port = if slot == SLUICE_SLOT_PORTLESS { rng.gen_range(0..5) } else { rng.gen_range(0..55) };
                let src = if rng.gen_bool(0.7) {
                    IpAddr::V4(u32::from_be_bytes([10, rng.gen_range(0..2), rng.gen_range(0..2), 9]).into())
                } else if rng.gen_bool(0.5) {
                    "2001:db8::7".parse().unwrap()
                } else {
                    "2001:db9::7".parse().unwrap()
                };
                let p = Probe { slot, port, src };
                assert_eq!(t.lookup(&p), first_match(&cfg, &p), "round {round}, {p:?}, rules {:?}", cfg.classes);
            }
        }
    }

    #[test]
    fn rule_count_does_not_change_lookup_shape() {
        // 1024 port rules over 63 classes (the most a config can add to the default)
        // compile into the same single array: rule j covers udp ports 16j..16j+15
        // and belongs to class j % 63, so a lookup is one cell whatever the count.
        let per_class = |c: usize| -> String {
            let rules: Vec<String> =
                (c..1024).step_by(63).map(|j| format!("match=udp:{}-{}", j * 16, j * 16 + 15)).collect();
            format!("c{c}:{}", rules.join(","))
        };
        let flags: Vec<String> = (0..63).map(per_class).collect();
        let cfg = crate::policy::config::from_flags(&flags).unwrap();
        assert_eq!(cfg.classes.iter().map(|c| c.rules.len()).sum::<usize>(), 1024);
        let t = compile(&cfg).unwrap();
        assert_eq!(t.cells.len(), SLUICE_CELLS as usize);
        for j in [0usize, 1, 62, 63, 500, 1023] {
            let port = (j * 16 + 7) as u16;
            assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, port, "1.1.1.1")), j % 63, "rule {j}, port {port}");
        }
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_UDP, 16384, "1.1.1.1")), cfg.default_class, "past the last rule");
        assert_eq!(t.lookup(&probe(SLUICE_SLOT_TCP, 17, "1.1.1.1")), cfg.default_class, "udp rules only");
    }
}
