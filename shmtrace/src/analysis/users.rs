//! Who uses the shared memory that ran out, from the evidence it leaves:
//! file names first (each library names its segments its own way), then
//! process names. Each user has its signature id, the message it prints
//! when /dev/shm runs out, and the settings that make it need less.

use super::scope::Scope;
use crate::state::failures::FailureKind;

/// PyTorch's words when a consumer finds a segment gone.
pub const TORCH_GONE: &str = "RuntimeError: unable to open shared memory object \
    </torch_...> in read-write mode: No such file or directory (2)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    /// `torch_*` segments (file_descriptor and file_system strategies),
    /// `pt_data_worker`/`pt_main_thread` threads.
    PytorchDataLoader,
    /// `torch_*` segments without a DataLoader: torch.multiprocessing
    /// Queues and share_memory_() (told apart in `diagnosis`, which knows
    /// what a DataLoader keeps in flight).
    PytorchMultiprocessing,
    /// Python's multiprocessing.shared_memory: `psm_*` (shm_open, sparse
    /// ftruncate, mmap: runs out at a page fault, as SIGBUS).
    PythonSharedMemory,
    /// NCCL's intra-node transport: `nccl-XXXXXX` (mkstemp, then
    /// posix_fallocate: runs out as ENOSPC).
    Nccl,
    /// Ray's object store: `plasmaXXXXXX` (mkstemp, unlink, sparse
    /// ftruncate, mmap: runs out later, as SIGBUS).
    RayObjectStore,
    /// PostgreSQL's dynamic shared memory: `PostgreSQL.N` (shm_open, then
    /// posix_fallocate: a parallel query runs out as ENOSPC).
    PostgresDsm,
    /// Open MPI's shared-memory transport: `vader_segment.*` (4.x) and
    /// `sm_segment.*` (5.x), one per rank.
    OpenMpi,
    /// joblib/loky memmapping of large arrays passed to workers: files
    /// under `joblib_memmapping_folder_*`.
    Joblib,
    /// Chromium and headless browsers (Puppeteer, Playwright):
    /// `.org.chromium.Chromium.*` segments.
    Chromium,
    /// POSIX named semaphores: `sem.NAME` (one page each).
    PosixSemaphore,
    /// Anything else: plain shm_open, files written into /dev/shm.
    Unknown,
}

impl User {
    /// The user of the memory in `r`: the first failure's own file decides
    /// when its name is known (but a semaphore, one page, is only ever
    /// collateral of what filled the mount); else PyTorch's fingerprints
    /// anywhere (its workers fail on segments of any name); else the most
    /// common kind of segment on the mount.
    pub fn recognize(r: &Scope) -> User {
        if let Some(u) = r
            .first_failure
            .and_then(|f| f.path.as_deref())
            .map(by_name)
            .filter(|u| !matches!(u, User::Unknown | User::PosixSemaphore))
        {
            return u;
        }
        let names: Vec<User> = r
            .failures
            .iter()
            .filter_map(|f| f.path.as_deref())
            .chain(r.files.iter().filter_map(|f| f.name.as_deref()))
            .map(by_name)
            .collect();
        let pytorch = r
            .processes
            .iter()
            .any(|p| p.comm.starts_with("pt_data_worker") || p.comm.starts_with("pt_main_thread"));
        if pytorch || names.contains(&User::PytorchDataLoader) {
            return User::PytorchDataLoader;
        }
        let mut best = (0, User::Unknown);
        for u in [
            User::Nccl,
            User::RayObjectStore,
            User::PythonSharedMemory,
            User::PostgresDsm,
            User::OpenMpi,
            User::Joblib,
            User::Chromium,
        ] {
            let n = names.iter().filter(|x| **x == u).count();
            if n > best.0 {
                best = (n, u);
            }
        }
        if best.0 == 0 && names.contains(&User::PosixSemaphore) {
            return User::PosixSemaphore;
        }
        if best.0 == 0 {
            // No segment says: the libraries the failing process mapped
            // (NCCL also runs inside PyTorch, which names its own segments).
            let libs = r
                .first_failure
                .map(|f| f.libraries.as_slice())
                .unwrap_or(&[]);
            if libs.contains(&"ray") {
                return User::RayObjectStore;
            }
            if libs.contains(&"libnccl") && !libs.contains(&"libtorch") {
                return User::Nccl;
            }
            // PostgreSQL's processes name themselves "postgres".
            if r.first_failure.is_some_and(|f| f.comm == "postgres") {
                return User::PostgresDsm;
            }
        }
        best.1
    }

    /// The signature's prefix: "pytorch-dataloader:sigbus".
    pub fn id(self) -> &'static str {
        match self {
            User::PytorchDataLoader => "pytorch-dataloader",
            User::PytorchMultiprocessing => "pytorch-multiprocessing",
            User::PythonSharedMemory => "python-shared-memory",
            User::Nccl => "nccl",
            User::RayObjectStore => "ray-object-store",
            User::PostgresDsm => "postgresql-dsm",
            User::OpenMpi => "openmpi-sm",
            User::Joblib => "joblib-memmap",
            User::Chromium => "chromium",
            User::PosixSemaphore => "posix-semaphore",
            User::Unknown => "shm",
        }
    }

    pub fn name(self) -> Option<&'static str> {
        match self {
            User::PytorchDataLoader => Some("PyTorch DataLoader"),
            User::PytorchMultiprocessing => Some("PyTorch torch.multiprocessing"),
            User::PythonSharedMemory => Some("Python multiprocessing.shared_memory"),
            User::Nccl => Some("NCCL"),
            User::RayObjectStore => Some("Ray object store (plasma)"),
            User::PostgresDsm => Some("PostgreSQL dynamic shared memory"),
            User::OpenMpi => Some("Open MPI shared-memory transport"),
            User::Joblib => Some("joblib/loky memmapping"),
            User::Chromium => Some("Chromium"),
            User::PosixSemaphore => Some("POSIX named semaphores"),
            User::Unknown => None,
        }
    }

    /// Whether processes of one parent sharing segments is the design (a
    /// sibling holding most of the bytes is no hoard).
    pub fn shares_between_siblings(self) -> bool {
        self != User::Unknown
    }

    /// What the library prints (or how the process dies) for this failure.
    /// PyTorch's is in `diagnosis`, which knows its workers.
    pub fn message(self, kind: FailureKind) -> Option<String> {
        use FailureKind::{Enoent, Enospc, Sigbus};
        let m = match (self, kind) {
            (User::PytorchMultiprocessing, Enospc) => {
                "RuntimeError: unable to allocate shared memory(shm) for file </torch_...>: No space \
                 left on device (28), in the producer's Queue feeder thread: the tensor is dropped \
                 and the consumer waits for it"
            }
            (User::PytorchMultiprocessing, Sigbus) => {
                "the producer dies of SIGBUS ('Bus error') while moving a tensor into shared \
                 memory (share_memory_() or Queue.put); the consumer waits for it or times out"
            }
            (User::PythonSharedMemory, Sigbus) => {
                "the process dies of SIGBUS: a shell prints 'Bus error (core dumped)', \
                 multiprocessing reports exitcode -7, a ProcessPoolExecutor raises \
                 BrokenProcessPool ('A process in the process pool was terminated abruptly')"
            }
            (User::PythonSharedMemory, Enospc) => "OSError: [Errno 28] No space left on device",
            (User::Nccl, Enospc) => {
                "NCCL WARN Error: failed to extend /dev/shm/nccl-XXXXXX to N bytes, then \
                 'NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)' \
                 (ncclSystemError) in every rank"
            }
            (User::Nccl, Sigbus) => {
                "the rank dies of SIGBUS ('Bus error'); torch.distributed then reports the \
                 other ranks' collective timeouts, not the cause"
            }
            (User::RayObjectStore, Sigbus) => {
                "the raylet (it hosts the object store) dies of SIGBUS: workers report \
                 'The object store process exited unexpectedly' or RayletDiedError, and \
                 tasks fail with ObjectLostError"
            }
            (User::RayObjectStore, Enospc) => {
                "the object store cannot create its backing file: Ray warns that /dev/shm is \
                 too small and the raylet fails to start"
            }
            (User::PytorchMultiprocessing, Enoent) => TORCH_GONE,
            (User::PythonSharedMemory, Enoent) => {
                "FileNotFoundError: [Errno 2] No such file or directory: '/psm_...' (from \
                 SharedMemory(name=...))"
            }
            (User::RayObjectStore, Enoent) => {
                "the plasma store's backing file is gone: workers fail to map objects \
                 (ObjectLostError)"
            }
            (User::PostgresDsm, Enospc) => {
                "ERROR:  could not resize shared memory segment \"/PostgreSQL.N\" to M bytes: \
                 No space left on device (in the client's session, whichever backend's error \
                 it relays; the parallel workers exit)"
            }
            (User::PostgresDsm, Sigbus) => {
                "LOG:  server process (PID N) was terminated by signal 7: Bus error, then \
                 every session is reset while the server restarts"
            }
            (User::OpenMpi, Enospc | Sigbus) => {
                "A system call failed during shared memory initialization that should not \
                 have (btl vader/sm: No space left on device), or a rank dies of SIGBUS and \
                 mpirun reports 'exited on signal 7 (Bus error)'"
            }
            (User::Joblib, Enospc) => {
                "OSError: [Errno 28] No space left on device, raised while joblib dumps a \
                 large argument for its workers (or a loky worker dies: TerminatedWorkerError)"
            }
            (User::Joblib, Sigbus) => {
                "a loky worker dies of SIGBUS: joblib raises TerminatedWorkerError ('A worker \
                 process managed by the executor was unexpectedly terminated')"
            }
            (User::Chromium, Enospc | Sigbus) => {
                "ERROR: Creating shared memory in /dev/shm/.org.chromium.Chromium.XXXXXX \
                 failed: No space left on device, then tabs crash ('Aw, Snap!', Puppeteer's \
                 'Page crashed!' or 'Target closed')"
            }
            (User::PosixSemaphore, Enospc) => {
                "sem_open: No space left on device (Python: OSError: [Errno 28] from \
                 multiprocessing.Lock/Queue/SemLock)"
            }
            _ => return None,
        };
        Some(m.to_string())
    }

    /// Settings of the library that make it need less /dev/shm (PyTorch's
    /// DataLoader has its own, computed, in `Diagnosis::dataloader`).
    pub fn knobs(self) -> Option<&'static str> {
        Some(match self {
            User::PythonSharedMemory => {
                "call .close() in every process and .unlink() once, when done: a \
                 SharedMemory never unlinked stays in /dev/shm after its process exits; make \
                 fewer or smaller segments, or pass data through a Queue/Pipe instead"
            }
            User::Nccl => {
                "NCCL_SHM_DISABLE=1 (intra-node traffic goes over P2P or the network instead \
                 of /dev/shm), or NCCL 2.23+ with NCCL_CUMEM_HOST_ENABLE=1 (host buffers from \
                 cuMem, not /dev/shm); fewer channels (NCCL_MAX_NCHANNELS) need less"
            }
            User::RayObjectStore => {
                "ray.init(object_store_memory=N) or `ray start --object-store-memory N` below \
                 the /dev/shm size (Ray sizes its store at 30% of memory by default), or let \
                 it fall back to /tmp (slower) with --plasma-directory=/tmp"
            }
            User::PostgresDsm => {
                "in postgresql.conf: dynamic_shared_memory_type = mmap (segments in the data \
                 directory, not /dev/shm), min_dynamic_shared_memory (reserved at start), a \
                 lower work_mem or hash_mem_multiplier (what a parallel hash join asks), or \
                 max_parallel_workers_per_gather = 0 (no parallel query, no segment for it)"
            }
            User::OpenMpi => {
                "--mca btl_vader_backing_directory /tmp (Open MPI 4) or --mca \
                 btl_sm_backing_directory /tmp (Open MPI 5) puts the segments elsewhere; \
                 --mca btl ^vader (^sm) sends intra-node traffic over TCP instead"
            }
            User::Joblib => {
                "JOBLIB_TEMP_FOLDER=/tmp (or Parallel(temp_folder=...)) memmaps somewhere \
                 with room; max_nbytes=None turns memmapping off; fewer n_jobs need fewer \
                 copies"
            }
            User::Chromium => {
                "--disable-dev-shm-usage (Chromium then writes its segments to /tmp), or a \
                 /dev/shm of 1-2 GiB for browsers (Puppeteer and Playwright advise \
                 --shm-size=1gb)"
            }
            User::PosixSemaphore => {
                "a semaphore needs one page: /dev/shm was full of something else; see the \
                 holders"
            }
            User::PytorchMultiprocessing => {
                "a consumer that keeps what it receives should keep private copies (t.clone()) \
                 and drop the received tensors, whose /dev/shm segments are then freed; \
                 set_sharing_strategy('file_system') passes named /dev/shm/torch_* files \
                 instead of fds and leaves them behind when a process dies"
            }
            User::PytorchDataLoader | User::Unknown => return None,
        })
    }
}

/// The user a file name (or path) points to.
pub fn by_name(path: &str) -> User {
    let mut parts = path.rsplit('/');
    let name = parts.next().unwrap_or(path);
    // joblib's files are named by their content's hash; their folder says.
    if parts
        .next()
        .is_some_and(|dir| dir.starts_with("joblib_memmapping_folder_"))
    {
        return User::Joblib;
    }
    if name.starts_with("torch_") {
        User::PytorchDataLoader
    } else if name.starts_with("psm_") {
        User::PythonSharedMemory
    } else if name.starts_with("nccl-") {
        User::Nccl
    } else if name.starts_with("plasma") {
        User::RayObjectStore
    } else if name.starts_with("PostgreSQL.") {
        User::PostgresDsm
    } else if name.starts_with("vader_segment.") || name.starts_with("sm_segment.") {
        User::OpenMpi
    } else if name.starts_with(".org.chromium.Chromium.") {
        User::Chromium
    } else if name.starts_with("sem.") {
        User::PosixSemaphore
    } else {
        User::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_point_to_their_library() {
        assert_eq!(by_name("/dev/shm/torch_123_456_7"), User::PytorchDataLoader);
        assert_eq!(by_name("/dev/shm/psm_0a1b2c3d"), User::PythonSharedMemory);
        assert_eq!(by_name("/dev/shm/nccl-Xk3bQ9"), User::Nccl);
        assert_eq!(by_name("plasmaAbC123"), User::RayObjectStore);
        assert_eq!(by_name("/dev/shm/sem.mp-1a2b"), User::PosixSemaphore);
        assert_eq!(by_name("/dev/shm/seg"), User::Unknown);
        assert_eq!(by_name("/dev/shm/PostgreSQL.1804289383"), User::PostgresDsm);
        assert_eq!(
            by_name("/dev/shm/vader_segment.node1.4a2b0001.0"),
            User::OpenMpi
        );
        assert_eq!(by_name("sm_segment.node1.0.1"), User::OpenMpi);
        assert_eq!(
            by_name("/dev/shm/.org.chromium.Chromium.Xy12Ab"),
            User::Chromium
        );
        assert_eq!(
            by_name("/dev/shm/joblib_memmapping_folder_42_0a1b_c2d3/1f2e-3d4c.pkl"),
            User::Joblib
        );
        // Only the file's own name counts, not a directory on the way.
        assert_eq!(by_name("/dev/shm/torch_dir/seg"), User::Unknown);
    }

    #[test]
    fn each_library_says_what_it_prints_and_how_to_need_less() {
        for u in [
            User::PythonSharedMemory,
            User::Nccl,
            User::RayObjectStore,
            User::PostgresDsm,
            User::OpenMpi,
            User::Joblib,
            User::Chromium,
        ] {
            assert!(u.message(FailureKind::Enospc).is_some(), "{u:?}");
            assert!(u.message(FailureKind::Sigbus).is_some(), "{u:?}");
            assert!(u.knobs().is_some(), "{u:?}");
            assert!(u.name().is_some());
        }
        assert!(
            User::Nccl
                .message(FailureKind::Enospc)
                .unwrap()
                .contains("NCCL")
        );
        assert!(User::Nccl.knobs().unwrap().contains("NCCL_SHM_DISABLE=1"));
        assert_eq!(User::Unknown.id(), "shm");
        assert!(User::Unknown.message(FailureKind::Sigbus).is_none());
    }
}
