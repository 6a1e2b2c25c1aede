//! Diagnosis drawn from facts that synthetic event streams left in state.

use super::*;
use crate::{
    analysis::{Facts, Report, facts::Context},
    event::{Event, ExitStatus, Syscall},
    state::tests::{MIB, dataloader_events, file, setup},
};

fn ctx() -> Context {
    Context {
        mode: "run",
        node: false,
        command: None,
        target_pid: Some(10),
        duration_s: 1.0,
        counters: Default::default(),
        host_stalls: Default::default(),
        exit: None,
        notes: Vec::new(),
    }
}

/// A DataLoader: main 10 and workers 11, 12, 13 filling 16 MiB
/// segments; worker 13 faults first, worker 11 after it; both die.
fn dataloader(names: &str) -> Facts {
    let (mut st, mut host, mut s) = setup();
    host.cmdlines.insert(10, "python train.py".into());
    st.add_existing(&mut host, 10, 0, true);
    let mut evs = dataloader_events(&mut s, names);
    for w in [13, 11] {
        evs.push(Event::Exit {
            h: s.h(w, 10),
            status: ExitStatus::from_kernel(7),
        });
    }
    for ev in &evs {
        st.apply(ev, &mut host);
    }
    Facts::gather(&st, ctx())
}

#[test]
fn a_dataloader_sigbus_names_the_first_worker_and_what_pytorch_gets_wrong() {
    let facts = dataloader("torch");
    let d = diagnose(&Scope::whole(&facts)).unwrap();
    assert_eq!(d.signature, "pytorch-dataloader:sigbus");
    assert_eq!(facts.first_failure.as_ref().unwrap().pid, 13);
    assert!(
        d.summary.starts_with("DataLoader worker 2 (pid 13"),
        "{}",
        d.summary
    );
    let msg = d.framework_message.unwrap();
    assert!(
        msg.contains("(pid 11) is killed by signal: Bus error"),
        "{msg}"
    );
    let wrong = d.framework_misleads.unwrap();
    assert!(
        wrong.contains("The first worker to fail was pid 13"),
        "{wrong}"
    );
    // 64 MiB in use + 2 x 8 MiB still wanted = 80 MiB; steady state
    // (2 segment makers x 2 + 2) x 16 MiB = 96 MiB; +25% -> 128 MiB.
    assert_eq!(d.recommended_shm_bytes, Some(128 * MIB));
    let basis = d.basis.unwrap();
    assert!(basis.contains("DataLoader steady state"), "{basis}");
    assert!(d.docker.unwrap().contains("--shm-size=128m"));
    assert!(d.dataloader.unwrap().starts_with("to fit 64 MiB"));
}

#[test]
fn other_users_get_a_generic_signature_without_dataloader_advice() {
    let facts = dataloader("seg");
    let d = diagnose(&Scope::whole(&facts)).unwrap();
    assert_eq!(d.signature, "shm:sigbus");
    assert!(d.framework.is_none() && d.dataloader.is_none());
    assert!(d.framework_message.is_none());
    assert!(d.recommended_shm_bytes.is_some());
}

#[test]
fn an_oom_kill_is_not_fixed_by_a_bigger_dev_shm() {
    let (mut st, mut host, mut s) = setup();
    st.apply(
        &Event::OomVictim {
            h: s.h(5, 1),
            victim: 7,
            shmem_rss: 0,
        },
        &mut host,
    );
    let d = diagnose(&Scope::whole(&Facts::gather(&st, ctx()))).unwrap();
    assert_eq!(d.signature, "memcg:oom-kill");
    assert_eq!(d.recommended_shm_bytes, None);
    assert!(d.basis.unwrap().contains("memory cgroup"));
}

#[test]
fn no_failure_no_diagnosis() {
    let (st, _, _) = setup();
    assert!(diagnose(&Scope::whole(&Facts::gather(&st, ctx()))).is_none());
}

#[test]
fn other_libraries_are_named_by_their_segments_with_their_own_settings() {
    for (names, signature, framework, knob) in [
        (
            "psm",
            "python-shared-memory:sigbus",
            "Python multiprocessing.shared_memory",
            ".unlink()",
        ),
        ("nccl-Xk3", "nccl:sigbus", "NCCL", "NCCL_SHM_DISABLE=1"),
        (
            "plasma",
            "ray-object-store:sigbus",
            "Ray object store (plasma)",
            "object_store_memory",
        ),
    ] {
        let facts = dataloader(names);
        let d = diagnose(&Scope::whole(&facts)).unwrap();
        assert_eq!(d.signature, signature);
        assert_eq!(d.framework.as_deref(), Some(framework));
        assert!(d.knobs.unwrap().contains(knob));
        assert!(d.framework_message.is_some(), "{names}");
        // No DataLoader arithmetic for them.
        assert!(d.dataloader.is_none());
        assert!(!d.basis.unwrap().contains("DataLoader"));
    }
}

#[test]
fn libraries_decide_when_segment_names_say_nothing() {
    for (libs, signature) in [
        (vec!["ray"], "ray-object-store:sigbus"),
        (vec!["libnccl", "libcudart"], "nccl:sigbus"),
        // NCCL inside PyTorch: PyTorch names its own segments; "seg" is not one.
        (vec!["libtorch", "libnccl"], "shm:sigbus"),
        (vec![], "shm:sigbus"),
    ] {
        let mut facts = dataloader("seg");
        facts.first_failure.as_mut().unwrap().libraries = libs.clone();
        let d = diagnose(&Scope::whole(&facts)).unwrap();
        assert_eq!(d.signature, signature, "{libs:?}");
    }
}

#[test]
fn the_process_shmtrace_was_given_is_no_worker() {
    // `run -- python train.py`: its parent (shmtrace) is not traced, and
    // the main process itself fails; a worker of its own fails after it.
    let (mut st, mut host, mut s) = setup();
    host.cmdlines.insert(10, "python train.py".into());
    st.add_existing(&mut host, 10, 0, true);
    let fork = s.h(10, 1);
    let main_fails = s.h(10, 1);
    // PyTorch 2.x names its DataLoader workers.
    let mut worker = s.h(11, 10);
    worker.comm = "pt_data_worker".into();
    let evs = vec![
        Event::Fork { h: fork, child: 11 },
        crate::state::tests::enospc(
            main_fails,
            Syscall::Fallocate,
            5,
            8 * MIB,
            file(100, "torch_10_1", 0, 0, 16000),
        ),
        crate::state::tests::enospc(
            worker,
            Syscall::Fallocate,
            5,
            8 * MIB,
            file(101, "torch_11_1", 0, 0, 16000),
        ),
    ];
    for e in &evs {
        st.apply(e, &mut host);
    }
    let d = diagnose(&Scope::whole(&Facts::gather(&st, ctx()))).unwrap();
    assert!(
        d.signature.starts_with("pytorch-dataloader"),
        "{}",
        d.signature
    );
    assert!(!d.summary.contains("DataLoader worker"), "{}", d.summary);
    assert!(d.summary.starts_with("pid 10 "), "{}", d.summary);
}

#[test]
fn segments_are_sized_by_their_makers_and_the_largest() {
    let facts = dataloader("torch");
    let scope = Scope::whole(&facts);
    // Workers 13 and 11 made 16 MiB segments and failed.
    assert_eq!(crate::analysis::segments::workers_allocating(&scope), 2);
    assert_eq!(crate::analysis::segments::largest_segment(&scope), 16 * MIB);
}

#[test]
fn dataloader_settings_that_fit_are_worked_out_from_the_size() {
    let facts = dataloader("torch");
    let d = diagnose(&Scope::whole(&facts)).unwrap();
    let fit = d.dataloader.unwrap();
    // 64 MiB, 80% usable (51.2 MiB), in flight (2 x 2 + 2) batches: at
    // most 8.5 MiB each; or 3 batches of 16 MiB: one worker, prefetch 1.
    assert!(
        fit.contains("with num_workers=2 and prefetch_factor=2, batches must be at most 8.5 MiB"),
        "{fit}"
    );
    assert!(
        fit.ends_with("or num_workers <= 1 with prefetch_factor=1"),
        "{fit}"
    );
}

#[test]
fn an_incident_scope_sees_only_its_own_mount() {
    let mut facts = dataloader("torch");
    // A second incident elsewhere: another mount, another namespace.
    let mut other = facts.failures[0].clone();
    other.incident = 99;
    other.pid = 500;
    other.dev = Some(crate::event::Dev(77));
    other.mnt_ns = 123;
    facts.failures.push(other);
    let first = facts.failures[0].incident;
    let mine = Scope::incident(&facts, first);
    assert!(mine.failures.iter().all(|f| f.pid != 500));
    let theirs = Scope::incident(&facts, 99);
    assert_eq!(theirs.failures.len(), 1);
    assert!(theirs.files.is_empty(), "no file of its mount was seen");
    assert!(theirs.processes.is_empty(), "none in its namespace");
}

#[test]
fn fallocate_by_unnamed_workers_is_torch_multiprocessing_not_a_dataloader() {
    // PyTorch 2.x names DataLoader workers pt_data_worker; these are not,
    // and they reserve with posix_fallocate: torch.multiprocessing.
    let (mut st, mut host, mut s) = setup();
    host.cmdlines.insert(10, "python train.py".into());
    st.add_existing(&mut host, 10, 0, true);
    let fork = s.h(10, 1);
    let worker = s.h(11, 10);
    let evs = vec![
        Event::Fork { h: fork, child: 11 },
        crate::state::tests::enospc(
            worker,
            Syscall::Fallocate,
            5,
            8 * MIB,
            file(100, "torch_11_1", 0, 0, 16000),
        ),
    ];
    for e in &evs {
        st.apply(e, &mut host);
    }
    let d = diagnose(&Scope::whole(&Facts::gather(&st, ctx()))).unwrap();
    assert!(
        d.signature.starts_with("pytorch-multiprocessing:"),
        "{}",
        d.signature
    );
    assert!(d.dataloader.is_none(), "no DataLoader arithmetic");
}

/// A mount of 64 MiB with 60 MiB in use: `holders` hold segment 500
/// (40 MiB) by fd, then each of `failing` (in that order) fails to
/// fallocate 24 MiB more. Processes are named `comm`.
fn held_then_full(comm: &str, segment: &str, holders: &[u32], failing: &[u32]) -> Report {
    let (mut st, mut host, mut s) = setup();
    let h = |s: &mut crate::state::tests::Stream, pid| {
        let mut h = s.h(pid, 1);
        h.comm = comm.into();
        h
    };
    host.file(crate::state::tests::SHM, 500, 40 * MIB as i64, 40 * MIB, 1);
    for (i, &pid) in holders.iter().enumerate() {
        host.open_fd(pid, 9, crate::state::tests::SHM, 500);
        st.apply(
            &Event::Opened {
                h: h(&mut s, pid),
                syscall: Syscall::Openat,
                fd: Some(9),
                flags: if i == 0 { libc::O_CREAT as u64 } else { 0 },
                file: file(500, segment, 0, 0, 0),
            },
            &mut host,
        );
    }
    for &pid in failing {
        let seg = file(501, &format!("{segment}x"), 0, 0, (60 * MIB) / 4096);
        st.apply(
            &crate::state::tests::enospc(h(&mut s, pid), Syscall::Fallocate, 10, 24 * MIB, seg),
            &mut host,
        );
    }
    Report::build(&st, ctx())
}

#[test]
fn a_process_that_keeps_what_it_holds_alone_is_named_as_a_possible_hoard() {
    // 30 holds 40 of the 60 MiB in use on its own and never failed.
    let r = held_then_full("app", "seg", &[30], &[12]);
    let caveat = r.diagnosis.unwrap().caveat.expect("a caveat");
    assert!(
        caveat.starts_with("pid 30 (app) held 40.0 MiB of the 60.0 MiB in use without failing"),
        "{caveat}"
    );
}

#[test]
fn postgres_parallel_workers_get_postgres_words_and_nothing_of_pytorch() {
    // The leader 20 and workers 21, 22 of one parallel query hold the same
    // DSM segment; 22 fails first, then 21, then the leader.
    let r = held_then_full(
        "postgres",
        "PostgreSQL.1804289383",
        &[20, 21, 22],
        &[22, 21, 20],
    );
    let d = r.diagnosis.as_ref().unwrap();
    assert_eq!(d.signature, "postgresql-dsm:enospc-fallocate");
    assert_eq!(
        d.framework.as_deref(),
        Some("PostgreSQL dynamic shared memory")
    );
    assert!(
        d.knobs
            .as_deref()
            .unwrap()
            .contains("dynamic_shared_memory_type")
    );
    assert!(
        d.framework_message
            .as_deref()
            .unwrap()
            .contains("could not resize shared memory segment")
    );
    // Every holder failed: none of them hoarded what the others wait for.
    assert!(d.caveat.is_none(), "{:?}", d.caveat);
    assert_eq!(r.facts.first_failure.as_ref().unwrap().pid, 22);
    let text = crate::output::summary::render(&r);
    let json = serde_json::to_string(&r).unwrap();
    for word in ["PyTorch", "DataLoader", "prefetch", "pid order", "torch"] {
        assert!(!text.contains(word), "{word} in:\n{text}");
        assert!(!json.contains(word), "{word} in the report");
    }
    assert!(text.contains("PostgreSQL"), "{text}");
}
