//! Reads of the machine that may block (a hung FUSE or NFS mount, a process
//! stuck in a page fault holding its mmap lock) run on worker threads, and
//! the event loop waits for each at most [`TIMEOUT`]. A read that timed out
//! marks its key (the method and what it was about) stuck until that read
//! returns: asked again meanwhile, it answers None at once, so one hung
//! mount costs one timeout, not one per event. Workers stuck in the kernel
//! cannot be cancelled: a new one replaces each, up to [`MAX_THREADS`];
//! past that, reads are skipped (and counted).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

/// Long enough that a loaded machine is not a stuck one.
pub const TIMEOUT: Duration = Duration::from_secs(1);
pub const MAX_THREADS: usize = 32;
/// Stuck keys remembered at most.
const MAX_STUCK: usize = 4096;

type Job = Box<dyn FnOnce() + Send>;

/// How often reads of the machine stalled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Stalls {
    /// Reads that took longer than the timeout (their answer was dropped).
    pub timed_out: u64,
    /// Reads not tried: their target had stalled recently, or every worker
    /// was stuck.
    pub skipped: u64,
}

struct Book {
    /// Keys whose read timed out, with a flag set when it returns.
    stuck: HashMap<String, Arc<AtomicBool>>,
    stalls: Stalls,
}

pub struct Blocking {
    jobs: mpsc::Sender<Job>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    threads: Arc<AtomicUsize>,
    idle: Arc<AtomicUsize>,
    book: Mutex<Book>,
    /// How long a read is waited for ([`TIMEOUT`] but in tests).
    timeout: Duration,
}

impl Default for Blocking {
    fn default() -> Self {
        Self::new()
    }
}

impl Blocking {
    pub fn new() -> Self {
        Self::with_timeout(TIMEOUT)
    }

    pub fn with_timeout(timeout: Duration) -> Self {
        let (jobs, rx) = mpsc::channel();
        Self {
            jobs,
            queue: Arc::new(Mutex::new(rx)),
            threads: Arc::new(AtomicUsize::new(0)),
            idle: Arc::new(AtomicUsize::new(0)),
            book: Mutex::new(Book {
                stuck: HashMap::new(),
                stalls: Stalls::default(),
            }),
            timeout,
        }
    }

    pub fn stalls(&self) -> Stalls {
        self.book.lock().map(|b| b.stalls).unwrap_or_default()
    }

    fn spawn_worker(&self) -> bool {
        if self.threads.fetch_add(1, Ordering::SeqCst) >= MAX_THREADS {
            self.threads.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        let (queue, idle, threads) = (self.queue.clone(), self.idle.clone(), self.threads.clone());
        idle.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("shmtrace-read".into())
            .spawn(move || {
                loop {
                    let job = match queue.lock() {
                        Ok(q) => q.recv(),
                        Err(_) => break,
                    };
                    let Ok(job) = job else { break };
                    idle.fetch_sub(1, Ordering::SeqCst);
                    job();
                    idle.fetch_add(1, Ordering::SeqCst);
                }
                idle.fetch_sub(1, Ordering::SeqCst);
                threads.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.idle.fetch_sub(1, Ordering::SeqCst);
            self.threads.fetch_sub(1, Ordering::SeqCst);
        }
        spawned.is_ok()
    }

    /// Runs `f` on a worker and waits for it at most [`TIMEOUT`]. None: it
    /// timed out, or `key` stalled recently, or no worker was free.
    pub fn run<T: Send + 'static>(
        &self,
        key: impl FnOnce() -> String,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let key = key();
        {
            let mut b = self.book.lock().ok()?;
            match b.stuck.get(&key) {
                Some(done) if !done.load(Ordering::SeqCst) => {
                    b.stalls.skipped += 1;
                    return None;
                }
                Some(_) => {
                    b.stuck.remove(&key);
                }
                None => {}
            }
        }
        if self.idle.load(Ordering::SeqCst) == 0 && !self.spawn_worker() {
            if let Ok(mut b) = self.book.lock() {
                b.stalls.skipped += 1;
            }
            return None;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
                finished.store(true, Ordering::SeqCst);
            }))
            .ok()?;
        match rx.recv_timeout(self.timeout) {
            Ok(v) => Some(v),
            Err(_) => {
                if let Ok(mut b) = self.book.lock() {
                    b.stalls.timed_out += 1;
                    if b.stuck.len() >= MAX_STUCK {
                        b.stuck.retain(|_, d| !d.load(Ordering::SeqCst));
                    }
                    if b.stuck.len() < MAX_STUCK {
                        b.stuck.insert(key, done);
                    }
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that blocks until the test lets it go.
    fn stuck() -> (mpsc::Sender<()>, impl FnOnce() -> u32 + Send + 'static) {
        let (release, wait) = mpsc::channel::<()>();
        (release, move || {
            let _ = wait.recv();
            5
        })
    }

    #[test]
    fn a_stuck_read_times_out_then_is_skipped_and_others_go_on() {
        let b = Blocking::with_timeout(Duration::from_millis(50));
        assert_eq!(b.run(|| "a".into(), || 1 + 1), Some(2));
        let (release, read) = stuck();
        assert_eq!(b.run(|| "stuck".into(), read), None);
        // Asked again while it hangs: skipped, not run (it would answer).
        assert_eq!(b.run(|| "stuck".into(), || 9), None);
        // Other reads still answer, on a new worker.
        assert_eq!(b.run(|| "b".into(), || 7), Some(7));
        assert_eq!(
            b.stalls(),
            Stalls {
                timed_out: 1,
                skipped: 1
            }
        );
        let _ = release.send(());
    }

    #[test]
    fn a_key_is_read_again_once_its_stuck_read_returns() {
        let b = Blocking::with_timeout(Duration::from_millis(50));
        let (release, read) = stuck();
        assert_eq!(b.run(|| "k".into(), read), None);
        release.send(()).unwrap();
        // Polled against a deadline: the worker returns when it is scheduled.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut answer = None;
        while answer.is_none() && std::time::Instant::now() < deadline {
            answer = b.run(|| "k".into(), || 3);
            std::thread::yield_now();
        }
        assert_eq!(answer, Some(3));
    }

    #[test]
    fn past_the_thread_cap_reads_are_skipped_and_counted() {
        let b = Blocking::with_timeout(Duration::from_millis(20));
        let mut releases = Vec::new();
        for i in 0..MAX_THREADS {
            let (release, read) = stuck();
            releases.push(release);
            assert_eq!(b.run(move || format!("k{i}"), read), None);
        }
        assert_eq!(b.run(|| "fresh".into(), || 1), None, "no worker left");
        let s = b.stalls();
        assert_eq!((s.timed_out, s.skipped), (MAX_THREADS as u64, 1));
        for r in releases {
            let _ = r.send(());
        }
    }
}
