use super::*;
use crate::policy::config::from_flags;
use owners::{nice_of, rescan_due};

/// A service whose owners run as root.
fn svc(l4: L4, port: u16, owners: &[(u32, &str, Result<i8, String>)]) -> Service {
    let owners = owners
        .iter()
        .map(|(pid, comm, nice)| Owner { pid: *pid, comm: comm.to_string(), nice: nice.clone(), uid: Some(0) })
        .collect();
    Service { l4, port, owners, family: Family::Both }
}

#[test]
fn priority_is_twenty_plus_the_highest_owners_nice() {
    let s = svc(L4::Udp, 53, &[(10, "nsd", Ok(5)), (11, "nsd", Ok(-3))]);
    let (p, why) = s.priority();
    assert_eq!(p, 17);
    assert!(why.contains("pid 11") && why.contains("nice -3") && why.contains("highest of 2"), "{why}");
    assert_eq!(svc(L4::Tcp, 80, &[(1, "x", Ok(-20))]).priority().0, 0);
    assert_eq!(svc(L4::Tcp, 80, &[(1, "x", Ok(19))]).priority().0, 39);
}

#[test]
fn login_users_and_nobody_get_the_default_priority_root_and_system_users_their_nice() {
    let logins = (1000, 60000);
    let by = |uids: &[u32]| {
        let mut s = svc(L4::Udp, 7777, &[(10, "x", Ok(-5)), (11, "x", Ok(-5))]);
        s.owners.truncate(uids.len());
        for (o, &u) in s.owners.iter_mut().zip(uids) {
            o.uid = Some(u);
        }
        s.priority_with(logins)
    };
    assert_eq!(by(&[0]).0, 15, "root: 20 + nice");
    assert_eq!(by(&[33]).0, 15, "a system user (www-data)");
    assert_eq!(by(&[61184]).0, 15, "a systemd dynamic user, above UID_MAX");
    let (p, why) = by(&[1000]);
    assert_eq!(p, UNTRUSTED_PRIORITY, "a login user: {why}");
    assert!(why.contains("uid 1000") && why.contains("default class's"), "{why}");
    assert_eq!(by(&[65534]).0, UNTRUSTED_PRIORITY, "nobody");
    // Issue 49, item 2: each of these was trusted before.
    assert_eq!(by(&[100_000]).0, UNTRUSTED_PRIORITY, "a rootless container's subordinate uid, above UID_MAX");
    assert_eq!(by(&[60_001]).0, UNTRUSTED_PRIORITY, "above UID_MAX, below the dynamic users");
    assert_eq!(by(&[1000, 0]).0, UNTRUSTED_PRIORITY, "a login user sharing root's port: untrusted");
    let mut unknown = svc(L4::Udp, 1, &[(1, "x", Ok(0))]);
    unknown.owners[0].uid = None;
    let (p, why) = unknown.priority_with(logins);
    assert_eq!(p, UNTRUSTED_PRIORITY, "a user that cannot be read: {why}");
    assert!(why.contains("cannot be read"), "{why}");
    let (p, why) = svc(L4::Udp, 1, &[]).priority_with(logins);
    assert_eq!(p, UNTRUSTED_PRIORITY, "no process holds the socket (one parked in SCM_RIGHTS): {why}");
    assert!(why.contains("no process"), "{why}");
}

/// Issue 23, item 5: a socket no process holds sent every poll (once a
/// second) through /proc again.
#[test]
fn an_unowned_socket_is_looked_for_again_only_after_a_while() {
    let now = Instant::now();
    let owners: HashMap<u32, Vec<u32>> = [(1, vec![10]), (2, vec![])].into_iter().collect();
    let just = Some(now);
    assert!(!rescan_due([1u32, 2].iter(), &owners, just, now), "known sockets, one unowned: no scan yet");
    assert!(rescan_due([1u32, 3].iter(), &owners, just, now), "a new socket: scan at once");
    let later = now + RESCAN_UNOWNED;
    assert!(rescan_due([2u32].iter(), &owners, just, later), "the unowned one, RESCAN_UNOWNED later");
    assert!(!rescan_due([1u32].iter(), &owners, just, later), "an owned one never");
    assert!(rescan_due([1u32].iter(), &HashMap::new(), None, now), "nothing scanned yet");
}

/// A port that a process binds and closes every few ms: the /proc scan
/// that follows a new socket often finds it closed already. Counted as
/// held by no one, it went to `USERS_CLASS` and back (a CI flake of
/// `a_churning_service_neither_crashes_the_daemon_nor_flaps_its_class`);
/// its creator's uid (sk_uid) now says whose it is.
#[test]
fn a_socket_no_process_holds_is_its_creators() {
    let logins = (1000, 60000);
    let root = svc(L4::Udp, 7300, &[(10, "python3", Ok(0))]);
    let found = root.owners.clone();
    assert_eq!(holders(found.clone(), None, &[0]), found, "owners found: those");
    assert_eq!(holders(Vec::new(), Some(&root), &[1000]), root.owners, "none found: the ones seen last");
    let by_uid = |uids: &[u32]| Service { owners: holders(Vec::new(), None, uids), ..root.clone() };
    let made_by_root = by_uid(&[0]);
    assert_eq!(made_by_root.untrusted_why(logins), None, "root made it: trusted");
    let (p, why) = made_by_root.priority_with(logins);
    assert_eq!(p, NICE_ZERO_PRIORITY, "its nice unknown: {why}");
    assert!(why.contains("no process visible in /proc holds the socket; uid 0 made it"), "{why}");
    let why = by_uid(&[1000]).untrusted_why(logins).expect("a login user made it: untrusted");
    assert_eq!(why, "no process visible in /proc holds the socket; uid 1000 made it, not root or a system user");
    assert!(by_uid(&[0, 65534]).untrusted_why(logins).is_some(), "one of its sockets nobody's: untrusted");
    assert!(by_uid(&[]).untrusted_why(logins).is_some(), "no socket, no owner: untrusted");
}

#[test]
fn login_defs_give_the_login_range() {
    assert_eq!(parse_login_defs(""), (1000, 60000));
    let defs = "# comment\nUID_MIN\t\t\t 500\nUID_MAX  59999\nSYS_UID_MIN 101\n";
    assert_eq!(parse_login_defs(defs), (500, 59999));
}

#[test]
fn an_unreadable_nice_counts_as_nice_zero_and_says_why() {
    let s = svc(L4::Udp, 53, &[(10, "nsd", Err("/proc/10/stat: No such process".into()))]);
    let (p, why) = s.priority();
    assert_eq!(p, NICE_ZERO_PRIORITY);
    assert!(why.contains("cannot be read") && why.contains("nice 0 assumed"), "{why}");
    // A readable owner wins over an unreadable one.
    let s = svc(L4::Udp, 53, &[(10, "a", Err("gone".into())), (11, "b", Ok(4))]);
    assert_eq!(s.priority().0, 24);
}

/// The nice comes from getpriority(2): this process's own, and an error
/// (not a value) for a pid that does not exist.
#[test]
fn nice_is_read_with_getpriority_and_a_missing_process_is_an_error() {
    // SAFETY: getpriority on this process.
    let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    assert_eq!(nice_of(std::process::id()), Ok(own as i8));
    assert!(nice_of(u32::MAX / 2).is_err_and(|e| e.contains("getpriority")));
}

#[test]
fn class_names_are_process_protocol_port() {
    assert_eq!(svc(L4::Udp, 53, &[(1, "nsd", Ok(0))]).class_name(), "nsd/udp:53");
    assert_eq!(svc(L4::Tcp, 8080, &[(1, "my server!", Ok(0))]).class_name(), "my_server_/tcp:8080");
    assert_eq!(svc(L4::Tcp, 22, &[]).class_name(), "unknown/tcp:22");
    assert_eq!(svc(L4::Udp, 53, &[(1, "nsd: xfrd", Ok(0))]).class_name(), "nsd/udp:53");
}

#[test]
fn the_port_range_falls_back_to_the_kernel_default() {
    assert_eq!(parse_port_range("32768\t60999\n"), (32768, 60999));
    assert_eq!(parse_port_range("1024 2000"), (1024, 2000));
    assert_eq!(parse_port_range("garbage"), (32768, 60999));
    assert_eq!(parse_port_range("5 1"), (32768, 60999));
}

#[test]
fn merge_adds_one_auto_class_per_service_before_the_default_class() {
    let base = from_flags(&[]).unwrap();
    let services = [svc(L4::Udp, 53, &[(1, "nsd", Ok(0))]), svc(L4::Tcp, 22, &[(2, "sshd", Ok(-5))])];
    let (cfg, note) = merge(&base, &services);
    let names: Vec<_> = cfg.classes.iter().map(|c| c.name.as_str()).collect();
    // Highest priority first; the default class stays last and stays the default.
    assert_eq!(names, ["sshd/tcp:22", "nsd/udp:53", "default"]);
    assert_eq!(cfg.default_class, 2);
    assert_eq!(cfg.classes[0].priority, 15);
    assert!(matches!(cfg.classes[1].limit, Limit::Auto(_)));
    assert!(cfg.classes[1].discovered.as_deref().unwrap().contains("nsd pid 1"));
    assert_eq!(note, MergeNote::default());
    // That the result compiles and classifies as merged: tests/discover.rs.
}

#[test]
fn a_configured_class_wins_over_discovery() {
    let base = from_flags(&["dns:priority=0,rate=auto,match=udp:53".into()]).unwrap();
    let services = [svc(L4::Udp, 53, &[(1, "nsd", Ok(0))]), svc(L4::Udp, 123, &[(2, "chronyd", Ok(0))])];
    let (cfg, note) = merge(&base, &services);
    let names: Vec<_> = cfg.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["dns", "chronyd/udp:123", "default"]);
    assert_eq!(note.covered, 1);
}

#[test]
fn a_thousand_ports_share_classes_instead_of_overflowing_the_table() {
    let base = from_flags(&[]).unwrap();
    let services: Vec<Service> = (0..1000u16)
        .map(|i| {
            svc(
                L4::Tcp,
                10_000 + i,
                &[(100 + u32::from(i % 3), ["a", "b", "c"][usize::from(i % 3)], Ok((i % 3) as i8))],
            )
        })
        .collect();
    let (cfg, note) = merge(&base, &services);
    assert!(cfg.classes.len() <= SLUICE_MAX_CLASSES as usize);
    assert!(note.grouped);
    assert_eq!(note.unplaced, 0);
    let names: Vec<_> = cfg.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a.p20/ports", "b.p21/ports", "c.p22/ports", "default"]);
    assert!(cfg.classes[0].discovered.as_deref().unwrap().starts_with("334 ports;"), "the count is in the reason");
    // A port more keeps every name (counters, controller and known clients go by it).
    let mut more = services.clone();
    more.push(svc(L4::Tcp, 11_000, &[(100, "a", Ok(0))]));
    let (again, _) = merge(&base, &more);
    let renamed: Vec<_> = again.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(renamed, names, "names stay when a port joins a group");
    // Too many distinct processes for a class each: one class per priority.
    let services: Vec<Service> =
        (0..1000u16).map(|i| svc(L4::Udp, 1000 + i, &[(u32::from(i), &format!("p{i}"), Ok(0))])).collect();
    let (cfg, note) = merge(&base, &services);
    assert_eq!(cfg.classes.len(), 2, "{:?}", cfg.classes.iter().map(|c| &c.name).collect::<Vec<_>>());
    assert_eq!(cfg.classes[0].name, "prio20/ports");
    assert_eq!(note.unplaced, 0);
}

#[test]
fn with_no_class_slot_left_services_go_to_the_default_class() {
    let flags: Vec<String> = (0..63).map(|i| format!("c{i}:match=udp:{}", 1000 + i)).collect();
    let base = from_flags(&flags).unwrap();
    assert_eq!(base.classes.len(), 64);
    let (cfg, note) = merge(&base, &[svc(L4::Udp, 53, &[])]);
    assert_eq!(cfg.classes.len(), 64);
    assert_eq!(note.unplaced, 1);
}

/// A real UDP socket on the wildcard and a TCP listener are found, with this
/// process as their owner; a loopback-bound one is not.
#[test]
fn discovery_finds_this_processes_listeners() {
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let tcp = std::net::TcpListener::bind("[::]:0").unwrap();
    let lo = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (up, tp, lp) =
        (udp.local_addr().unwrap().port(), tcp.local_addr().unwrap().port(), lo.local_addr().unwrap().port());
    let mut d = Discovery::new(1).unwrap();
    let found = d.poll().unwrap();
    let me = std::process::id();
    let find = |l4, port| found.iter().find(|s| s.l4 == l4 && s.port == port);
    // Ports picked by the kernel are ephemeral, so the UDP one is skipped as a client's.
    assert!(find(L4::Udp, up).is_none(), "an ephemeral UDP port is a client's socket");
    let t = find(L4::Tcp, tp).expect("the TCP listener is found");
    assert!(t.owners.iter().any(|o| o.pid == me && o.nice.is_ok()), "{t:?}");
    assert!(find(L4::Udp, lp).is_none(), "a loopback-bound socket is not reachable from the interface");
}

/// An IPv6-only socket held by another process beside a service's IPv4 one
/// is a service of its own (issue 23, item 3: it counted as the service's).
#[test]
fn a_v6_only_bind_beside_an_ipv4_service_is_a_service_of_its_own() {
    let owners: HashMap<u32, Vec<u32>> = [(1, vec![100]), (2, vec![100]), (3, vec![200]), (4, vec![100])].into();
    use Family::*;
    assert_eq!(by_family(&[(1, V4), (3, V6)], &owners), [(V4, vec![100]), (V6, vec![200])]);
    assert_eq!(by_family(&[(1, V4), (2, V6)], &owners), [(Both, vec![100])], "one process: one service");
    assert_eq!(by_family(&[(1, V4), (4, Both), (3, V6)], &owners), [(Both, vec![100, 200])], "a dual-stack socket");
    assert_eq!(by_family(&[(3, V6)], &owners), [(Both, vec![200])], "IPv6 alone");

    let mut v4 = svc(L4::Udp, 53, &[(100, "nsd", Ok(-5))]);
    v4.family = V4;
    let mut v6 = svc(L4::Udp, 53, &[(200, "mine", Ok(0))]);
    v6.family = V6;
    v6.owners[0].uid = Some(1000);
    let base = from_flags(&[]).unwrap();
    let (cfg, _) = merge(&base, &[v4, v6]);
    let class = |name: &str| cfg.classes.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("{name}: {cfg:?}"));
    let (nsd, mine) = (class("nsd/udp4:53"), class(USERS_CLASS));
    assert_eq!(nsd.priority, 15);
    assert_eq!(mine.priority, UNTRUSTED_PRIORITY);
    assert_eq!(mine.rules[0].src, Family::V6.prefix(), "the user's IPv6 bind, in the users' class");
}

/// Issue 49, item 1: a local user who binds many ports took every class
/// slot, and the host's services were grouped under new names (counters,
/// controllers and known clients reset). Untrusted services now share one
/// class, so the host's classes keep their names whatever users bind.
#[test]
fn what_local_users_bind_renames_no_class_of_the_host() {
    let base = from_flags(&[]).unwrap();
    let host = [svc(L4::Udp, 53, &[(1, "nsd", Ok(0))]), svc(L4::Tcp, 22, &[(2, "sshd", Ok(-5))])];
    let (before, _) = merge(&base, &host);
    let mut all = host.to_vec();
    for port in 20_000..20_200u16 {
        let mut s = svc(L4::Udp, port, &[(3, "python3", Ok(0))]);
        s.owners[0].uid = Some(65534);
        all.push(s);
    }
    let (cfg, note) = merge(&base, &all);
    let names: Vec<_> = cfg.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["sshd/tcp:22", "nsd/udp:53", USERS_CLASS, "default"]);
    assert_eq!(note, MergeNote::default(), "nothing grouped, nothing unplaced");
    assert_eq!(cfg.classes[2].rules.len(), 200);
    assert!(cfg.classes[2].discovered.as_deref().unwrap().contains("untrusted"));
    let remap = crate::policy::remap::ClassRemap::of(&before, &cfg);
    assert_eq!((remap.old_of(0), remap.old_of(1)), (Some(0), Some(1)));
    // With no room left for it, the users' services go to the default class.
    let flags: Vec<String> = (0..61).map(|i| format!("c{i}:match=udp:{}", 1000 + i)).collect();
    let (cfg, note) = merge(&from_flags(&flags).unwrap(), &all);
    assert_eq!(cfg.classes.len(), 64);
    assert!(cfg.classes.iter().any(|c| c.name == "nsd/udp:53") && !cfg.classes.iter().any(|c| c.name == USERS_CLASS));
    assert_eq!(note.unplaced, 200);
}

/// One reading of the listeners serves every handle while it is fresh; a
/// listener that appears is in the next reading after LISTENERS_FRESH.
#[test]
fn one_reading_of_the_listeners_serves_every_handle_while_fresh() {
    let (mine, shared) = {
        let l = Listeners::new(0).unwrap();
        (l.clone(), l)
    };
    let t0 = Instant::now();
    let before = mine.now().unwrap();
    let tcp = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let has = |ls: &[Listening]| ls.iter().any(|l| l.l4 == L4::Tcp && l.port == port);
    assert!(!has(&before));
    let again = shared.now().unwrap();
    // Only if this machine got here within the freshness (a stalled test says nothing).
    if t0.elapsed() < LISTENERS_FRESH {
        assert_eq!(again, before, "the other handle got the same reading");
    }
    std::thread::sleep(LISTENERS_FRESH);
    let after = shared.now().unwrap();
    let l = after.iter().find(|l| l.l4 == L4::Tcp && l.port == port).expect("read again once stale");
    assert_eq!((l.addr, l.family), (std::net::IpAddr::from([0, 0, 0, 0]), Family::V4));
    assert!(has(&mine.now().unwrap()), "and the first handle sees that reading");
}

/// Issue 49, item 7: where docker-proxy listens on the host side of a port
/// the namespace DNATs to a container, a SYN the gate answered opened the
/// connection on the proxy instead of the container. Its class answers no
/// SYN (said in its reason); other services', and a user's process that
/// names itself so, keep the automatic guard.
#[test]
fn a_dnat_proxys_listener_gets_no_syn_answers() {
    let base = from_flags(&[]).unwrap();
    let mut user = svc(L4::Tcp, 9090, &[(3, "docker-proxy", Ok(0))]);
    user.owners[0].uid = Some(1000);
    let services = [svc(L4::Tcp, 8080, &[(1, "docker-proxy", Ok(0))]), svc(L4::Tcp, 80, &[(2, "nginx", Ok(0))]), user];
    let (cfg, _) = merge(&base, &services);
    let class = |name: &str| cfg.classes.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("{name}"));
    let proxy = class("docker-proxy/tcp:8080");
    assert_eq!(proxy.syn_cookies, SynCookies::Off);
    assert!(proxy.discovered.as_deref().unwrap().contains("NATed port"), "{:?}", proxy.discovered);
    assert_eq!(class("nginx/tcp:80").syn_cookies, SynCookies::Auto);
    assert_eq!(class(USERS_CLASS).syn_cookies, SynCookies::Auto, "a login user's process is not taken at its name");
}
