//! A fork-join pool for the CPU forward pass, built for regions of a few
//! microseconds (llama.cpp's scheme): one forward at batch 1 runs about 150
//! parallel regions, and rayon's park/wake between them cost about a quarter
//! of the time (kernel scheduler frames in the profile).
//!
//! - Persistent workers, `threads - 1` of them: the thread that calls
//!   [`for_each`] takes part as worker 0, so `--threads 2` means two
//!   runnable threads on two cores, not three.
//! - A region is `n` tasks claimed one at a time from an atomic counter;
//!   the caller spins on an atomic count of finished tasks.
//! - Between regions a worker spins on the shared word for [`SPIN`], then
//!   parks on a condition variable, so an idle server burns no CPU.
//!
//! Invariants:
//! - The shared word packs `epoch | tasks | next`: the caller publishes a
//!   region with one store (a new epoch, its task count, next = 0), and a
//!   worker claims task `next` with a compare-and-swap that also checks the
//!   epoch and `next < tasks`. So a claim always belongs to the live region,
//!   whatever the worker saw before (a late worker cannot claim a task of a
//!   region that has ended, nor of one it has not read).
//! - The task function is read only after a successful claim, and the
//!   caller does not return (nor publish another region) before every task
//!   of its region has finished: the function's borrows outlive every call.
//! - One region at a time: a second caller (another thread, or a task that
//!   calls [`for_each`] itself) runs its tasks serially on its own thread;
//!   nothing waits on anything, so nothing deadlocks.
//! - A task that panics is caught; the region still completes, and the
//!   caller then resumes the first panic on its own thread (the pool stays
//!   usable).
//!
//! Cost per region: one store and one load by the caller, one
//! compare-and-swap and one add per task, and the cache-line transfers of
//! the shared word (well under a microsecond on one socket), versus several
//! microseconds for a rayon fork-join whose workers went to sleep. A region
//! after an idle spell also pays a futex wake (tens of microseconds) for
//! each parked worker; the caller starts on the tasks meanwhile.
//!
//! Safety: the task function is passed to the workers as a raw pointer to a
//! [`Job`] on the caller's stack, lifetime erased. That is sound because of
//! the second invariant: the pointer is dereferenced only by a worker that
//! holds an unfinished task of the region, and the caller waits for all of
//! them before its stack frame ends (even when a task panics).

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks. The serial gaps inside a
/// forward pass (norms, rotary, activation quantization) take a few
/// microseconds; between engine steps, sampling and scheduling take longer,
/// and an idle server must not burn a core. Longer spins lost on a loaded
/// machine (a spinning thread is charged by the kernel's fair scheduler and
/// loses the core to sleepers when its work arrives): decode at batch 1 under
/// load ~17 on 2 cores, 18 tok/s spinning 1 ms, 24 spinning 50 us.
const SPIN: Duration = Duration::from_micros(50);

/// How long the caller spins on unfinished tasks before it parks until the
/// last one finishes (a worker that was descheduled mid-task, on a loaded
/// machine, must get the core rather than watch the caller spin).
const WAIT_SPIN: Duration = Duration::from_micros(50);

/// Bits of the shared word: next task (low), task count, epoch (high).
const IDX_BITS: u32 = 20;
const EPOCH_SHIFT: u32 = 2 * IDX_BITS;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;

/// Tasks per thread callers should cut a product into: a worker descheduled
/// mid-task then holds only a small share of the region, and the others
/// claim the rest.
pub const TASKS_PER_THREAD: usize = 4;

/// Most tasks one region holds; [`for_each`] groups larger counts.
const MAX_TASKS: usize = IDX_MASK as usize;

fn pack(epoch: u64, tasks: usize, next: usize) -> u64 {
    (epoch << EPOCH_SHIFT) | ((tasks as u64) << IDX_BITS) | next as u64
}

fn epoch_of(w: u64) -> u64 {
    w >> EPOCH_SHIFT
}

fn tasks_of(w: u64) -> usize {
    ((w >> IDX_BITS) & IDX_MASK) as usize
}

fn next_of(w: u64) -> usize {
    (w & IDX_MASK) as usize
}

/// A region's task function, on the caller's stack.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync + 'a),
}

type Payload = Box<dyn Any + Send + 'static>;

/// State shared by the caller and the workers.
struct Shared {
    /// `epoch | tasks | next` (see the module invariants).
    word: AtomicU64,
    /// The live region's [`Job`] (a `*const Job` with its lifetime erased).
    job: AtomicPtr<()>,
    /// Tasks of the live region that have finished (panicked ones included).
    done: AtomicUsize,
    /// The first panic of the live region.
    panic: Mutex<Option<Payload>>,
    /// The live region's caller, unparked by whoever finishes its last task.
    caller: Mutex<Option<std::thread::Thread>>,
    /// Parked workers and their wake-up.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The process-wide pool.
struct Pool {
    shared: &'static Shared,
    /// Worker threads started (the caller is not one of them).
    workers: usize,
    /// Held by the one caller whose region is live.
    busy: AtomicBool,
}

static THREADS: OnceLock<usize> = OnceLock::new();
static POOL: OnceLock<Pool> = OnceLock::new();

/// Fixes the number of threads (the caller included) before the pool's
/// first use, e.g. from `--threads`. Returns false, changing nothing, when
/// the pool was already sized differently (first call wins).
pub fn set_threads(n: usize) -> bool {
    let n = n.max(1);
    *THREADS.get_or_init(|| n) == n
}

/// Threads a region runs on, the caller included (at least 1). Defaults to
/// rayon's global pool size (all cores, or `RAYON_NUM_THREADS`).
pub fn threads() -> usize {
    pool().workers + 1
}

fn pool() -> &'static Pool {
    POOL.get_or_init(|| Pool::new(*THREADS.get_or_init(|| rayon::current_num_threads().max(1))))
}

impl Pool {
    /// A pool of `threads` (the caller included): starts `threads - 1`
    /// workers, which live as long as the process.
    fn new(threads: usize) -> Self {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            word: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            caller: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        let mut workers = 0;
        for i in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("forward-{i}"))
                .spawn(move || worker(shared));
            if spawned.is_err() {
                tracing::warn!(threads = i, "could not start more forward-pass threads");
                break;
            }
            workers += 1;
        }
        Pool {
            shared,
            workers,
            busy: AtomicBool::new(false),
        }
    }

    /// [`for_each`] on this pool.
    fn for_each<F: Fn(usize) + Sync>(&self, n: usize, f: F) {
        if n <= 1 {
            if n == 1 {
                f(0);
            }
            return;
        }
        if self.workers == 0
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..n).for_each(f);
            return;
        }
        let result = if n <= MAX_TASKS {
            run(self.shared, n, &f)
        } else {
            let per = n.div_ceil(MAX_TASKS);
            run(self.shared, n.div_ceil(per), &|t| {
                (t * per..((t + 1) * per).min(n)).for_each(&f)
            })
        };
        self.busy.store(false, Ordering::Release);
        if let Err(p) = result {
            resume_unwind(p);
        }
    }
}

thread_local! {
    /// Set while this thread is inside [`serially`].
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every region it starts on this thread run serially on
/// this thread (the pool's other threads stay out): one-thread speed
/// where the pool has several, for benchmarks that measure both.
pub fn serially<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERIAL.with(|s| s.replace(true)));
    f()
}

/// Runs `f(0)`, ..., `f(n - 1)` on the pool's threads and the calling one,
/// and returns when all have finished. Tasks may run in any order and
/// concurrently. A panic in a task is resumed here once the region is over.
pub fn for_each<F: Fn(usize) + Sync>(n: usize, f: F) {
    if n > 1 && SERIAL.with(|s| s.get()) {
        (0..n).for_each(f);
        return;
    }
    if n <= 1 {
        if n == 1 {
            f(0);
        }
        return;
    }
    pool().for_each(n, f);
}

/// Runs `f` on every item of `items` ([`for_each`], one task per item):
/// the items are disjoint parts of a buffer the tasks fill, each reached
/// by one task only.
pub fn for_each_mut<T: Send, F: Fn(&mut T) + Sync>(items: &mut [T], f: F) {
    if items.len() <= 1 {
        items.iter_mut().for_each(f);
        return;
    }
    let cells: Vec<Mutex<&mut T>> = items.iter_mut().map(Mutex::new).collect();
    for_each(cells.len(), |i| f(&mut lock(&cells[i])));
}

/// How many parts to cut `values` values of row-wise work into: one per
/// thread (times 2, as descheduled workers leave less behind) where the
/// work is worth a region, else 1; never more than `rows`.
pub fn parts(rows: usize, values: usize) -> usize {
    /// Below this many values a row-wise pass (activation quantization,
    /// the gated activation) takes a few microseconds: one thread.
    const MIN_VALUES: usize = 1 << 13;
    if values < MIN_VALUES {
        1
    } else {
        (2 * threads()).min(rows).max(1)
    }
}

/// One region of `n` (`2..=MAX_TASKS`) tasks, the caller taking part.
fn run(s: &Shared, n: usize, f: &(dyn Fn(usize) + Sync)) -> Result<(), Payload> {
    let job = Job { f };
    s.job
        .store(&job as *const Job<'_> as *mut (), Ordering::Relaxed);
    s.done.store(0, Ordering::Relaxed);
    *lock(&s.caller) = Some(std::thread::current());
    let epoch = (epoch_of(s.word.load(Ordering::Relaxed)) + 1) & (u64::MAX >> EPOCH_SHIFT);
    // SeqCst pairs with the workers' `sleepers` increment (see `park`); as a
    // release it also publishes `job` and `done` above.
    s.word.store(pack(epoch, n, 0), Ordering::SeqCst);
    if s.sleepers.load(Ordering::SeqCst) > 0 {
        let _g = lock(&s.lock);
        s.wake.notify_all();
    }
    work(s, epoch);
    let start = Instant::now();
    let mut spins = 0u32;
    while s.done.load(Ordering::Acquire) < n {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && start.elapsed() > WAIT_SPIN {
            // Spurious wake-ups (a late unpark of an earlier region) loop.
            std::thread::park();
        } else {
            std::hint::spin_loop();
        }
    }
    s.job.store(std::ptr::null_mut(), Ordering::Relaxed);
    lock(&s.panic).take().map_or(Ok(()), Err)
}

/// Claims and runs tasks of region `epoch` until none is left; whoever
/// finishes the last task unparks the caller.
fn work(s: &Shared, epoch: u64) {
    while let Some((i, n)) = claim(s, epoch) {
        // SAFETY: we hold task `i` of the live region, unfinished: its
        // caller is inside `run`, waiting for `done` to count this task, so
        // the `Job` it stored (read here after the claim, which acquired the
        // word the caller published after storing `job`) is alive.
        let job = unsafe { &*(s.job.load(Ordering::Acquire) as *const Job<'_>) };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| (job.f)(i))) {
            lock(&s.panic).get_or_insert(p);
        }
        if s.done.fetch_add(1, Ordering::Release) + 1 == n {
            // The caller may be parked; a thread handle is cheap to wake
            // when it is not (one atomic swap).
            if let Some(t) = lock(&s.caller).as_ref() {
                t.unpark();
            }
        }
    }
}

/// Claims the next task of region `epoch`, if that region is live and has
/// one: `(task, tasks in the region)`.
fn claim(s: &Shared, epoch: u64) -> Option<(usize, usize)> {
    let mut w = s.word.load(Ordering::Acquire);
    loop {
        if epoch_of(w) != epoch || next_of(w) >= tasks_of(w) {
            return None;
        }
        match s
            .word
            .compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some((next_of(w), tasks_of(w))),
            Err(now) => w = now,
        }
    }
}

/// A worker thread: waits for a new epoch, helps with its tasks, repeats.
fn worker(s: &'static Shared) {
    let mut seen = epoch_of(s.word.load(Ordering::Acquire));
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = epoch_of(s.word.load(Ordering::Acquire));
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                park(s, seen);
            } else {
                std::hint::spin_loop();
            }
        }
        work(s, seen);
    }
}

/// Sleeps until the epoch differs from `seen`.
fn park(s: &Shared, seen: u64) {
    let mut g = lock(&s.lock);
    // SeqCst: either the caller's store of a new epoch comes first in the
    // total order (we see it below and do not wait), or this increment does
    // (the caller sees a sleeper and notifies under the lock we hold until
    // `wait` releases it): no lost wake-up.
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    while epoch_of(s.word.load(Ordering::SeqCst)) == seen {
        g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
}

/// Locks, ignoring poisoning (the guarded data stays consistent: a task
/// panic is caught before it could unwind through a guard).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A private pool (tests run in parallel: the global one may be busy).
    fn private(threads: usize) -> &'static Pool {
        Box::leak(Box::new(Pool::new(threads)))
    }

    fn check_once(run: impl Fn(usize, &(dyn Fn(usize) + Sync))) {
        for n in [0, 1, 2, 3, 7, 64, 1000, MAX_TASKS * 2 + 5] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            for (i, h) in hits.iter().enumerate() {
                assert_eq!(h.load(Ordering::Relaxed), 1, "n {n}, task {i}");
            }
        }
    }

    #[test]
    fn every_task_runs_exactly_once() {
        check_once(|n, f| for_each(n, f));
        let p = private(3);
        check_once(|n, f| p.for_each(n, f));
    }

    #[test]
    fn serially_keeps_every_task_on_the_calling_thread() {
        let me = std::thread::current().id();
        let elsewhere = AtomicUsize::new(0);
        serially(|| {
            for_each(64, |_| {
                if std::thread::current().id() != me {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        assert_eq!(elsewhere.load(Ordering::Relaxed), 0);
        assert!(!SERIAL.with(|s| s.get()), "the flag is restored");
        check_once(|n, f| serially(|| for_each(n, f)));
    }

    #[test]
    fn for_each_mut_reaches_every_item_once() {
        let mut items: Vec<u32> = (0..37).collect();
        for_each_mut(&mut items, |v| *v = *v * 2 + 1);
        assert!(items
            .iter()
            .enumerate()
            .all(|(i, &v)| v == 2 * i as u32 + 1));
        assert_eq!(parts(32, 10), 1, "small work stays on one thread");
        assert!((1..=2 * threads()).contains(&parts(32, 1 << 20)));
        assert_eq!(parts(1, 1 << 20), 1, "never more parts than rows");
    }

    #[test]
    fn concurrent_and_nested_callers_complete() {
        // Four threads issue regions at once, and every task issues a nested
        // region: the losers of the pool run serially, nobody waits forever.
        let p = private(2);
        let total = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..4 {
                sc.spawn(|| {
                    for _ in 0..200 {
                        p.for_each(8, |_| {
                            p.for_each(3, |_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 8 * 3);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
        let p = private(2);
        let ran = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            p.for_each(16, |i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 5, "task five fails");
            });
        }));
        let msg = r.expect_err("the panic propagates");
        let text = msg
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(text.contains("task five fails"), "{text}");
        assert_eq!(ran.load(Ordering::Relaxed), 16, "the region completed");
        let after = AtomicUsize::new(0);
        p.for_each(16, |_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.load(Ordering::Relaxed), 16);
    }

    #[test]
    fn parked_workers_wake_for_the_next_region() {
        let p = private(2);
        p.for_each(2, |_| {});
        // Longer than SPIN: the worker parks, and must wake for this region
        // (256 tasks of 200 us: the caller alone would take 51 ms).
        let t = Instant::now();
        while p.shared.sleepers.load(Ordering::SeqCst) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the worker never parked"
            );
            std::thread::sleep(SPIN);
        }
        let ids = Mutex::new(std::collections::HashSet::new());
        p.for_each(256, |_| {
            lock(&ids).insert(std::thread::current().id());
            std::thread::sleep(Duration::from_micros(200));
        });
        let seen = lock(&ids).len();
        assert_eq!(seen, 2, "threads that ran tasks");
    }

    #[test]
    fn word_packing_round_trips() {
        let w = pack(12345, MAX_TASKS, 17);
        assert_eq!(
            (epoch_of(w), tasks_of(w), next_of(w)),
            (12345, MAX_TASKS, 17)
        );
    }
}
