//! Metrics rendered from state that synthetic events left.
use super::*;
use crate::{
    event::{Dev, Event, FailedCall, FileRef, Header, MountPages, Syscall},
    host::fixture::{Fixture, SELF_NS},
};

#[test]
fn renders_mounts_failures_and_losses_with_escaped_labels() {
    let dev = Dev(40);
    let mut host = Fixture::with_shm(dev, 64 << 20);
    let mut st = State::new(0, &mut host);
    let h = Header {
        ts_ns: 10,
        pid: 5,
        tid: 5,
        ppid: 1,
        ns_pid: 0,
        mnt_ns: SELF_NS,
        cgroup_id: 0,
        memcg_id: 0,
        comm: "w".into(),
    };
    let file = FileRef {
        dev,
        ino: 2,
        name: Some("a\"b".into()),
        size: 0,
        allocated: 0,
        unlinked: false,
        mount: MountPages {
            dev,
            max_pages: 0,
            used_pages: 0,
        },
    };
    for _ in 0..3 {
        st.apply(
            &Event::SyscallFailed {
                h: h.clone(),
                errno: libc::ENOSPC,
                limits: None,
                mnt_flags: 0,
                call: FailedCall::OnFile {
                    syscall: Syscall::Fallocate,
                    fd: 3,
                    offset: Some(0),
                    bytes: Some(1 << 20),
                    prot: None,
                    mountpoint: None,
                    file: file.clone(),
                },
            },
            &mut host,
        );
    }
    st.tick(&mut host);
    for m in st.mount_stats_mut().all_mut() {
        m.memory_room_bytes = Some(48 << 20);
    }
    let mut c = Counters::default();
    c.lost.events_ring = 7;
    let text = render(&st, &c, LabelSet::default(), Format::OpenMetrics);
    assert!(text.contains("shmtrace_tmpfs_memory_room_bytes{mountpoint=\"/dev/shm\",dev=\"0:40\",namespace=\"\",pod=\"\",container=\"\",container_id=\"\"} 50331648"), "{text}");
    assert!(text.contains("shmtrace_tmpfs_size_bytes{mountpoint=\"/dev/shm\",dev=\"0:40\",namespace=\"\",pod=\"\",container=\"\",container_id=\"\"} 67108864"), "{text}");
    assert!(text.contains("shmtrace_shm_failures_total{reason=\"tmpfs_full\",kind=\"enospc\",namespace=\"\",pod=\"\",container=\"\",container_id=\"\"} 3"), "{text}");
    assert!(
        text.contains("shmtrace_events_lost_total{stage=\"events_ring\"} 7"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    // deploy/'s alerting rules name only series this serves.
    let rules = include_str!("../../../deploy/alerts.rules.yaml");
    let mut named = 0;
    for (i, _) in rules.match_indices("shmtrace_") {
        let name: String = rules[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        if name.ends_with('_') {
            continue; // prose, not a series
        }
        named += 1;
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))),
            "alerts.rules.yaml names {name}, which shmtrace does not serve:\n{text}"
        );
    }
    assert!(named >= 5, "{named}");
    // A hostile mount point cannot forge a line.
    let mut st2 = st;
    for m in st2.mount_stats_mut().all_mut() {
        m.mountpoint = Some("/x\"} 1\nshmtrace_fake 2".into());
    }
    let text = render(&st2, &c, LabelSet::default(), Format::Text);
    assert!(
        !text.lines().any(|l| l.starts_with("shmtrace_fake")),
        "{text}"
    );
}

#[test]
fn classic_text_names_counters_by_their_samples_and_node_totals_start_at_zero() {
    let mut host = Fixture::with_shm(Dev(40), 64 << 20);
    let st = State::new(0, &mut host);
    let c = Counters::default();
    let text = render(&st, &c, LabelSet::default(), Format::Text);
    for want in [
        "# HELP shmtrace_events_lost_total Kernel events lost, by stage.",
        "# TYPE shmtrace_events_lost_total counter",
        "# TYPE shmtrace_incidents_total counter",
        "shmtrace_incidents_total 0",
        "shmtrace_incidents_open 0",
        "shmtrace_failures_total 0",
        "shmtrace_events_total 0",
        "shmtrace_events_lost_total{stage=\"events_ring\"} 0",
    ] {
        assert!(text.lines().any(|l| l == want), "no `{want}` in:\n{text}");
    }
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    // Every sample belongs to the family its HELP and TYPE named.
    let mut family = String::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            family = rest.split(' ').next().unwrap().to_string();
        } else if !l.starts_with('#') {
            assert!(l.starts_with(&family), "{l} outside {family}");
        }
    }
    let om = render(&st, &c, LabelSet::default(), Format::OpenMetrics);
    assert!(om.contains("# TYPE shmtrace_events_lost counter") && om.ends_with("# EOF\n"));
}

#[test]
fn series_keep_their_order_between_scrapes() {
    let mut host = Fixture::with_shm(Dev(40), 64 << 20);
    let st = State::new(0, &mut host);
    let mut c = Counters::default();
    c.lost.failures_ring = 2;
    c.lost.traced_map_full = 1;
    let first = render(&st, &c, LabelSet::default(), Format::Text);
    for _ in 0..20 {
        assert_eq!(render(&st, &c, LabelSet::default(), Format::Text), first);
    }
    let lost: Vec<&str> = first
        .lines()
        .filter(|l| l.starts_with("shmtrace_events_lost_total{"))
        .collect();
    let mut want = lost.clone();
    want.sort_unstable();
    assert_eq!(lost, want);
    assert_eq!(lost.len(), 3);
}

#[test]
fn accept_header_picks_the_format() {
    assert_eq!(Format::from_accept(None), Format::Text);
    assert_eq!(
        Format::from_accept(Some("text/plain;version=0.0.4;q=0.9,*/*;q=0.1")),
        Format::Text
    );
    assert_eq!(
        Format::from_accept(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )),
        Format::OpenMetrics
    );
    assert!(
        Format::Text
            .content_type()
            .starts_with("text/plain; version=0.0.4")
    );
}

#[test]
fn label_sets_parse_and_pods_are_named() {
    let keep: LabelSet = "namespace,pod".parse().unwrap();
    assert!(keep.namespace && keep.pod && !keep.container);
    assert!("pid".parse::<LabelSet>().is_err());
    let mut c = crate::state::containers::parse(
        "/kubepods/besteffort/pod1b2c3d4e-0000-4000-8000-00000000beef/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    );
    c.named(crate::state::containers::Names {
        container: Some("w".into()),
        pod_namespace: Some("ml".into()),
        pod_name: Some("job-0".into()),
    });
    let p = pod(Some(&c), LabelSet::default());
    assert_eq!(
        (p.namespace.as_str(), p.pod.as_str(), p.container.as_str()),
        ("ml", "job-0", "w")
    );
    assert_eq!(pod(Some(&c), keep).container, "");
}

#[test]
fn mounts_carry_the_container_owning_their_namespace_and_the_hosts_none() {
    use crate::host::mountinfo::{Mount, Usage};
    let host_shm = Dev(27);
    let mut host = Fixture::with_shm(host_shm, 64 << 20);
    host.namespaces.insert(1, SELF_NS);
    let ids = [
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210",
    ];
    let (ns, devs) = ([4026532901u32, 4026532902], [Dev(41), Dev(42)]);
    for i in 0..2 {
        host.mounts.insert(
            ns[i],
            vec![Mount {
                dev: devs[i],
                mountpoint: "/dev/shm".into(),
                fstype: "tmpfs".into(),
                noexec: false,
            }],
        );
        host.usage.insert(
            devs[i],
            Usage {
                size_bytes: 64 << 20,
                used_bytes: 1 << 20,
                inodes: 1000,
                inodes_used: 2,
            },
        );
        host.cgroup_ids
            .insert(500 + i as u64, format!("/libpod_parent/libpod-{}", ids[i]));
    }
    let mut st = State::new(0, &mut host);
    let h = |pid: u32, mnt_ns: u32, cgroup_id: u64| Header {
        ts_ns: 10,
        pid,
        tid: pid,
        ppid: 1,
        ns_pid: 0,
        mnt_ns,
        cgroup_id,
        memcg_id: 0,
        comm: "w".into(),
    };
    // The first container's `runc init`: in its cgroup, still in the
    // host's namespace; then each container's process in its own.
    st.apply(
        &Event::Fork {
            h: h(150, SELF_NS, 500),
            child: 151,
        },
        &mut host,
    );
    for i in 0..2 {
        let pid = 100 + 100 * i as u32;
        let file = FileRef {
            dev: devs[i],
            ino: 2,
            name: Some("seg".into()),
            size: 1 << 20,
            allocated: 1 << 20,
            unlinked: false,
            mount: MountPages {
                dev: devs[i],
                max_pages: 0,
                used_pages: 0,
            },
        };
        st.apply(
            &Event::Opened {
                h: h(pid, ns[i], 500 + i as u64),
                syscall: Syscall::Openat,
                fd: Some(3),
                flags: libc::O_CREAT as u64,
                file,
            },
            &mut host,
        );
    }
    st.tick(&mut host);
    let text = render(&st, &Counters::default(), LabelSet::default(), Format::Text);
    let size_line = |dev: &str| {
        text.lines()
            .find(|l| l.starts_with("shmtrace_tmpfs_size_bytes{") && l.contains(dev))
            .unwrap_or_else(|| panic!("no size of {dev}:\n{text}"))
            .to_string()
    };
    assert!(
        size_line("dev=\"0:27\"")
            .contains("namespace=\"\",pod=\"\",container=\"\",container_id=\"\"}"),
        "the host's /dev/shm is nobody's:\n{text}"
    );
    for (i, id) in ids.iter().enumerate() {
        let l = size_line(&format!("dev=\"0:{}\"", 41 + i));
        assert!(
            l.contains(&format!(
                "container=\"{}\",container_id=\"podman://{id}\"}}",
                &id[..12]
            )),
            "{l}\n{text}"
        );
    }
    // Each container holds its own file: one series each.
    let held: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("shmtrace_container_shm_held_bytes{"))
        .collect();
    assert_eq!(held.len(), 2, "{text}");
}
