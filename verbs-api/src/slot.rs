//! One engine of a device as the verbs layer holds it: the engine behind its lock with its
//! port type erased ([`DeviceEngine`]), the doorbells its QPs ring, and how its thread
//! idles and program threads share the work with it.
//!
//! On a machine with as many busy threads as cores, an engine thread that spins holds a
//! core the program needs, and a frame for it waits for a scheduler time slice,
//! milliseconds away. So an engine thread on a port with a descriptor (AF_PACKET, TAP, the
//! pipe) sleeps when idle on that descriptor and an eventfd, until a frame arrives, its next
//! QP deadline, or another thread wakes it; and a program thread in a verb turns the engine
//! itself when no other thread holds it (`post_send` transmits at once, `poll` on a CQ
//! receives). The engine thread then covers the time the program spends outside the
//! library: spinning on memory (`ib_write_lat`), computing, or blocked on a completion
//! channel.
//!
//! Tried and left out: the engine thread not listening to the port while a program polls
//! a CQ in a loop (it receives its frames itself, and each frame also wakes the engine
//! thread for nothing). Switching an epoll set's interest on and off from the program's
//! polls cost more than those wakeups: ib_send_lat's typical latency over the drop-in went
//! from about 13 to 27–130 µs.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ferroce_drivers::wait::{wait_readable, Wakeup};
use ferroce_drivers::Port;

use crate::engine::{Engine, EngineCore, Mailbox};

/// An engine with its port type erased: the loop, which is compiled per driver, and its two
/// halves, the port-independent [`EngineCore`] (QPs, memory, timers, counters) and the port
/// as `dyn Port` (link, clock, memory mapping, wakeups).
pub(crate) trait DeviceEngine: Send {
    fn poll(&mut self) -> usize;
    fn core(&self) -> &EngineCore;
    fn core_mut(&mut self) -> &mut EngineCore;
    fn port(&self) -> &dyn Port;
    fn port_mut(&mut self) -> &mut dyn Port;
    /// The device's ports this engine drives (one, or every port of a multi-port device).
    fn port_count(&self) -> usize;
    fn port_at(&self, i: usize) -> &dyn Port;
    fn port_at_mut(&mut self, i: usize) -> &mut dyn Port;
}

impl<P: Port + Send> DeviceEngine for Engine<P> {
    fn poll(&mut self) -> usize {
        Self::poll(self)
    }
    fn core(&self) -> &EngineCore {
        self
    }
    fn core_mut(&mut self) -> &mut EngineCore {
        self
    }
    fn port(&self) -> &dyn Port {
        Self::port(self)
    }
    fn port_mut(&mut self) -> &mut dyn Port {
        Self::port_mut(self)
    }
    fn port_count(&self) -> usize {
        self.ports().len()
    }
    fn port_at(&self, i: usize) -> &dyn Port {
        &self.ports()[i]
    }
    fn port_at_mut(&mut self, i: usize) -> &mut dyn Port {
        &mut self.ports_mut()[i]
    }
}

/// One engine of a device and the doorbells its QPs ring.
pub(crate) struct EngineSlot {
    engine: Mutex<Box<dyn DeviceEngine>>,
    pub(crate) doorbells: Arc<Mailbox<u32>>,
    pub(crate) idle: Idle,
    /// More work the engine thread does each turn, outside the engine's lock: a service's
    /// forwarder between its programs' rings and the QPs (set before the thread starts).
    pub(crate) poller: std::sync::OnceLock<Arc<dyn Poller>>,
}

/// Work an engine thread does beside its engine (see [`EngineSlot::poller`]): polled every
/// turn, and asked before the thread sleeps, which it then also does on [`fd`](Self::fd).
pub(crate) trait Poller: Send + Sync {
    /// One pass: how much moved.
    fn poll(&self) -> usize;
    /// The thread is about to sleep: announce it to whoever must then ring
    /// [`fd`](Self::fd), and look once more; true when there is work after all.
    fn prepare_sleep(&self) -> bool;
    /// The thread woke: clear what `prepare_sleep` announced.
    fn woke(&self);
    /// What wakes the thread for this work.
    fn fd(&self) -> std::os::fd::RawFd;
}

impl EngineSlot {
    pub(crate) fn new(engine: Box<dyn DeviceEngine>) -> Self {
        Self {
            doorbells: engine.core().doorbells.clone(),
            engine: Mutex::new(engine),
            idle: Idle::new(),
            poller: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Box<dyn DeviceEngine>> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The engine if no other thread holds it now.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Box<dyn DeviceEngine>>> {
        match self.engine.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

/// Longest an idle engine thread sleeps without a deadline or a frame: a bound on how late
/// it notices something nobody woke it for.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// Longest a multi-port engine thread sleeps: how late, at worst, an idle device notices a
/// port's link going down or coming back.
const LINK_SLEEP: Duration = Duration::from_millis(1);

/// Idle turns an engine thread takes before it sleeps: enough for the frames of a burst
/// still on their way, few enough that the thread does not hold a core that a program
/// (which turns the engine itself when it enters a verb) needs. Spinning longer, waiting for
/// a request's answer, measured worse on two cores: ib_send_lat's typical latency over the
/// drop-in went from 12.5 to 40 µs with 50 µs of spinning, the spinning engine threads
/// taking turns with the programs' own.
const IDLE_TURNS_BEFORE_SLEEP: u32 = 32;

/// What an engine thread found when it went to sleep.
enum Bedtime {
    /// Nothing to do: sleep this long (the next QP deadline, at most [`MAX_SLEEP`]).
    Sleep(Duration),
    /// Another thread holds the engine.
    Busy,
    /// The last look found work.
    Work,
}

/// The scheduler time slice an engine thread that sleeps asks for (see
/// [`ferroce_drivers::wait::request_short_slice`]): the kernel's minimum, so that when a
/// frame wakes it, it runs before threads spinning through their default slices. Measured
/// here (2 cores): an eventfd wakeup beside three spinning threads took 3.3 µs at the median
/// instead of 14.6; ib_write_lat over the drop-in showed a p99 of about 2 ms (a woken engine
/// thread waiting out a spinner's slice) in 3 of 3 runs without it and in about half the
/// runs with it, the others under 60 µs.
const WOKEN_SLICE: Duration = Duration::from_micros(100);

/// The window over which an engine thread measures how much CPU it uses (see [`Governor`]).
const CLASS_WINDOW: Duration = Duration::from_millis(100);

/// The share of a CPU above which a raised engine thread drops back (see [`Governor`]): it is
/// carrying a stream, where a scheduler's slice costs nothing (there is always work queued),
/// and raised it would keep its CPU from the program threads that feed it (in the real-time
/// class, up to the kernel's real-time throttling, 95 % by default, which then stops every
/// real-time thread of the CPU for the rest of its period).
const RAISED_MAX_SHARE: f64 = 0.9;

/// How an engine thread that sleeps when idle asks the scheduler to run it when woken
/// (`FERROCE_ENGINE_SCHED`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Raise {
    /// The normal class at nice -20 (`nice`).
    Nice,
    /// The real-time class, `SCHED_FIFO` priority 1 (`fifo`).
    Fifo,
    /// Neither: nice 0 with a short slice (the default, or `normal`).
    Off,
}

impl Raise {
    fn from_env() -> Self {
        // Off unless asked for: raised, an engine thread takes the work from a program
        // that turns the engine itself in a loop, in small pieces (ib_send_bw at 0.81-0.87
        // of its rate; docs/benchmarks.md has the measurements and what was tried).
        match std::env::var("FERROCE_ENGINE_SCHED").as_deref() {
            Ok("nice") => Self::Nice,
            Ok("fifo") => Self::Fifo,
            _ => Self::Off,
        }
    }
}

/// Keeps an engine thread raised above the programs' threads while that helps.
///
/// An engine thread woken by a frame must run at once. At nice 0 it waits out the slice of
/// whatever spins on its CPU: it uses 30–90 % of a CPU in a latency test (its sends carry the
/// peer's receive path through a veth), more than its fair share beside spinning programs, so
/// the scheduler holds it back for milliseconds. ib_write_lat, whose programs spin on memory
/// and never enter the library, showed a p99.9 of about 2 ms so. Raised, it runs at once:
/// - at nice -20 its fair share is nearly the whole CPU, and the normal class puts a woken
///   thread on an idle CPU when there is one;
/// - in the real-time class (`fifo`) it also runs at once, but a woken real-time thread stays
///   on the CPU it last ran on, preempting a program spinning there while another CPU idles.
///   ib_read_lat, whose server program sleeps, shows it: typical 28–33 µs with `fifo`, 9–10
///   at nice -20 or nice 0.
///
/// The thread drops back (nice 0, or out of the real-time class) when it used more than
/// [`RAISED_MAX_SHARE`] of a CPU over a [`CLASS_WINDOW`], and is raised again below half
/// that. CPU time, not time outside its sleeps: a thread whose sleeps all return at once (a
/// descriptor that stays readable) is running all the same.
///
/// Tried and dropped: dropping back while a program thread polls a CQ of the engine (the
/// program then receives the frames itself): ib_write_lat polls its send CQ too, and its
/// p99.9 went back to 2 ms. Lower shares or shorter windows (40–60 % over 1–100 ms) dropped
/// latency tests' engine threads back in mid-test, with the same result.
///
/// Raising is asked for with `FERROCE_ENGINE_SCHED=nice` (or `fifo`); by default, or where
/// it is refused (no CAP_SYS_NICE; RLIMIT_NICE or RLIMIT_RTPRIO too low), the thread keeps
/// nice 0 with a short slice.
struct Governor {
    raise: Raise,
    /// Raising was granted (once): the thread's class is ours to choose.
    allowed: bool,
    raised: bool,
    /// The last window's CPU share was over [`RAISED_MAX_SHARE`].
    busy: bool,
    window: std::time::Instant,
    cpu: Duration,
}

impl Governor {
    fn new(sleeps: bool) -> Self {
        let raise = if sleeps {
            Raise::from_env()
        } else {
            Raise::Off
        };
        let allowed = raise != Raise::Off && Self::lift(raise);
        if sleeps && !allowed {
            // Refused before Linux 6.12; the thread then keeps the default slice.
            let _ = ferroce_drivers::wait::request_short_slice(WOKEN_SLICE);
        }
        if raise != Raise::Off && !allowed {
            raise_refused(raise);
        }
        Self {
            raise,
            allowed,
            raised: allowed,
            busy: false,
            window: std::time::Instant::now(),
            cpu: ferroce_drivers::wait::thread_cpu_time(),
        }
    }

    /// Looks at the window, if it is over: how much of it the thread ran.
    fn check(&mut self) {
        if !self.allowed {
            return;
        }
        let wall = self.window.elapsed();
        if wall < CLASS_WINDOW {
            return;
        }
        let cpu = ferroce_drivers::wait::thread_cpu_time();
        let share = cpu.saturating_sub(self.cpu).as_secs_f64() / wall.as_secs_f64();
        self.busy = if self.busy {
            share >= RAISED_MAX_SHARE / 2.0
        } else {
            share > RAISED_MAX_SHARE
        };
        self.window = std::time::Instant::now();
        self.cpu = cpu;
        let want = !self.busy;
        if want != self.raised {
            self.raised = if want {
                Self::lift(self.raise)
            } else {
                !Self::drop_back(self.raise)
            };
        }
    }

    /// Raises the calling thread; false when refused.
    fn lift(raise: Raise) -> bool {
        use ferroce_drivers::wait;
        match raise {
            Raise::Nice => wait::request_nice(-20, WOKEN_SLICE).is_ok(),
            Raise::Fifo => wait::request_realtime(1).is_ok(),
            Raise::Off => false,
        }
    }

    /// Back to nice 0 with a short slice; true when done.
    fn drop_back(raise: Raise) -> bool {
        use ferroce_drivers::wait;
        match raise {
            Raise::Nice => wait::request_nice(0, WOKEN_SLICE).is_ok(),
            Raise::Fifo => wait::leave_realtime(WOKEN_SLICE).is_ok(),
            Raise::Off => true,
        }
    }
}

/// Says once per process, on stderr, that engine threads could not be raised and what would
/// let them.
fn raise_refused(raise: Raise) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        let grant = match raise {
            Raise::Fifo => "CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 (ulimit -r 1)",
            _ => "CAP_SYS_NICE or an RLIMIT_NICE of 40 (ulimit -e 40)",
        };
        eprintln!(
            "ferroce: engine threads cannot be raised above the program's, so latency tails \
             may reach milliseconds; grant {grant}, or unset FERROCE_ENGINE_SCHED to \
             silence this"
        );
    });
}

/// Turns of an engine thread between calls of its periodic work (see [`EngineSlot::run`]).
const EVERY_TURNS: u32 = 1024;

/// How long an engine thread sleeps when another thread holds its engine (see
/// [`EngineSlot::run`]).
const BUSY_SLEEP: Duration = Duration::from_micros(200);

/// What an engine thread asleep on its port shares with the threads that might wake it.
pub(crate) struct Idle {
    /// `None` when the machine gave no eventfd: the thread then never sleeps.
    wakeup: Option<Wakeup>,
    /// Set after each notification, so the sleeper drains the eventfd (a system call) only
    /// when something was written to it, not after every wakeup by a frame.
    notified: AtomicBool,
    asleep: AtomicBool,
    /// The QP deadline the sleeper will wake for by itself (port clock, ns).
    until: AtomicU64,
    /// Set while an engine thread that sleeps when idle runs this engine: other threads
    /// then turn it themselves when it is free. An engine thread that never sleeps (DPDK)
    /// is always turning, and is left alone.
    sleeper: AtomicBool,
}

impl Idle {
    pub(crate) fn new() -> Self {
        Self {
            wakeup: Wakeup::new().ok(),
            notified: AtomicBool::new(false),
            asleep: AtomicBool::new(false),
            until: AtomicU64::new(u64::MAX),
            sleeper: AtomicBool::new(false),
        }
    }

    /// Wakes the engine thread if it sleeps (work was queued for it).
    pub(crate) fn wake(&self) {
        // Pairs with the fence after `asleep` is set: either the sleeper's last look finds
        // the work, or this finds it asleep.
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Acquire) {
            self.notify();
        }
    }

    fn notify(&self) {
        if let Some(w) = &self.wakeup {
            // Written first, flagged after: a drain that misses the flag leaves the eventfd
            // readable (one spurious wakeup later), never a notification unread.
            w.notify();
            self.notified.store(true, Ordering::Release);
        }
    }

    /// Quiet again after a sleep.
    fn notify_drain(&self) {
        if let Some(w) = &self.wakeup {
            if self.notified.swap(false, Ordering::AcqRel) {
                w.drain();
            }
        }
    }

    /// Wakes the engine thread whatever it is doing (it is being stopped).
    pub(crate) fn wake_always(&self) {
        self.notify();
    }
}

impl EngineSlot {
    /// One turn of the engine on the calling thread, if no other thread is turning it
    /// (an application thread in a verb, while the engine thread sleeps or is between
    /// turns). An engine thread asleep past a deadline this turn armed is woken for it.
    pub(crate) fn turn_if_free(&self) -> bool {
        if !self.idle.sleeper.load(Ordering::Acquire) {
            return false;
        }
        let Some(mut e) = self.try_lock() else {
            return false;
        };
        self.app_turn(&mut **e);
        true
    }

    /// One turn by a thread other than the engine thread, with the engine held: the clock
    /// read afresh (turns from a program thread may be far apart), and the engine thread
    /// woken if it sleeps past a deadline the turn armed.
    pub(crate) fn app_turn(&self, e: &mut dyn DeviceEngine) {
        e.core_mut().resume();
        e.poll();
        self.after_turn(e);
    }

    /// True while an engine thread that sleeps when idle runs this engine.
    pub(crate) fn sleep_capable(&self) -> bool {
        self.idle.sleeper.load(Ordering::Acquire)
    }

    /// After a turn by a thread other than the engine thread: wakes the engine thread if it
    /// sleeps past a deadline the turn armed.
    fn after_turn(&self, e: &mut dyn DeviceEngine) {
        if let Some(d) = e.core_mut().take_earliest_new_deadline() {
            if self.idle.asleep.load(Ordering::Acquire)
                && d < self.idle.until.load(Ordering::Acquire)
            {
                self.idle.notify();
            }
        }
    }

    /// The engine thread's loop: turn the engine while it has work; after
    /// [`IDLE_TURNS_BEFORE_SLEEP`] turns without any, sleep on the port's descriptor until a
    /// frame arrives, the next QP deadline, or another thread's wakeup. A port without a
    /// descriptor (DPDK), or an engine that shares its port's queues with others, is polled
    /// without sleeping (yielding when idle).
    ///
    /// `every` is called every [`EVERY_TURNS`] turns and after each sleep, outside the
    /// engine's lock (the first engine's thread evens its device's load there).
    pub(crate) fn run(&self, stop: &AtomicBool, shares_port: bool, every: &mut dyn FnMut()) {
        // Every port's descriptor, and the wakeup's: a multi-port engine sleeps on all.
        let fds: Option<Vec<_>> = {
            let e = self.lock();
            (0..e.port_count()).map(|i| e.port_at(i).rx_fd()).collect()
        };
        let poller = self.poller.get().cloned();
        let sleeper = match (fds, &self.idle.wakeup) {
            (Some(mut fds), Some(w)) if !shares_port => {
                fds.push(w.fd());
                fds.extend(poller.as_ref().map(|p| p.fd()));
                Some(fds)
            }
            _ => None,
        };
        let multi_port = self.lock().port_count() > 1;
        self.idle
            .sleeper
            .store(sleeper.is_some(), Ordering::Release);
        let mut governor = Governor::new(sleeper.is_some());
        // The last look found the engine held by another thread (see `Bedtime::Busy`).
        let mut held_elsewhere = false;
        let mut idle = 0u32;
        let mut turns = 0u32;
        while !stop.load(Ordering::Acquire) {
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(EVERY_TURNS) {
                every();
            }
            if turns.is_multiple_of(64) {
                governor.check();
            }
            // Never wait for the lock: a thread holding it is turning the engine, doing what
            // this thread would (and a blocked engine thread costs the holder a futex wake).
            let mut work = match self.try_lock() {
                Some(mut e) => {
                    held_elsewhere = false;
                    e.poll()
                }
                None => 0,
            };
            if let Some(p) = &poller {
                work += p.poll();
            }
            if work > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            let Some(fds) = sleeper.as_deref() else {
                if idle > 1024 {
                    // Poll mode, but not at the expense of a machine with few cores.
                    std::thread::yield_now();
                }
                continue;
            };
            if idle < IDLE_TURNS_BEFORE_SLEEP {
                std::hint::spin_loop();
                continue;
            }
            // A multi-port engine wakes to look at its links (carrier changes make no frame).
            let longest = if multi_port { LINK_SLEEP } else { MAX_SLEEP };
            let bedtime = match self.prepare_sleep() {
                Bedtime::Sleep(_) if poller.as_ref().is_some_and(|p| p.prepare_sleep()) => {
                    Bedtime::Work
                }
                b => b,
            };
            let (timeout, bounded) = match bedtime {
                Bedtime::Sleep(t) => (t.min(longest), t >= MAX_SLEEP && !multi_port),
                // Another thread is turning the engine now: it takes what arrives while it
                // does. Sleep on the descriptors anyway (a packet socket's is readable while
                // frames wait, whoever reads them), briefly, since the port could not be
                // armed for a frame that comes after that thread's last turn.
                Bedtime::Busy if !held_elsewhere || !governor.raised => {
                    held_elsewhere = true;
                    (BUSY_SLEEP, false)
                }
                // Held still, since before the last sleep, which frames for the holder may
                // have cut short, by a thread this raised one may have preempted (its sleeps
                // on the port then all return at once, and the holder never runs). Wait for
                // the lock in the kernel, which runs the holder until it lets go. A thread
                // that is not raised shares its CPU with the holder and sleeps as above.
                //
                // This costs a program that turns the engine in a loop: `ib_send_bw` ran
                // at 0.75–0.9 of its rate before (the engine thread holds the engine more,
                // so more of the program's posts go through the inbox, and releases wake
                // the waiter). Tried and dropped: sleeping on the port as before (raised, the
                // engine thread kept the holder off its CPU: `ib_send_bw` at 2.1–4.2 Gb/s
                // against 5.5–6.2); napping on the wakeup alone (round trips of 3–40 ms);
                // dropping back to nice 0 until the engine is free (round trips of 0.8–3 ms,
                // `ib_send_bw` 3.4–4.9); taking the engine between two of the program's
                // turns before waiting (2000 looks), or sleeping again at once after the
                // turn: no better.
                Bedtime::Busy => {
                    self.idle.asleep.store(false, Ordering::Release);
                    if let Some(p) = &poller {
                        p.woke();
                    }
                    let mut e = self.lock();
                    held_elsewhere = false;
                    e.core_mut().resume();
                    e.poll();
                    idle = 0;
                    continue;
                }
                Bedtime::Work => {
                    self.idle.asleep.store(false, Ordering::Release);
                    if let Some(p) = &poller {
                        p.woke();
                    }
                    idle = 0;
                    continue;
                }
            };
            let woken = wait_readable(fds, Some(timeout)).unwrap_or(true);
            governor.check();
            self.idle.asleep.store(false, Ordering::Release);
            self.idle.notify_drain();
            if let Some(p) = &poller {
                p.woke();
            }
            if let Some(mut e) = self.try_lock() {
                e.core_mut().resume();
                // A sleep that only the bound ended, after which there is work: a wakeup
                // went missing (counted, so tests can insist there are none).
                let missed = bounded && !woken && e.poll() > 0;
                e.core_mut().count_sleep(missed);
            }
            every();
            idle = 0;
        }
        self.idle.sleeper.store(false, Ordering::Release);
    }

    /// Announces the sleep and looks once more, with the engine held: how long to sleep.
    fn prepare_sleep(&self) -> Bedtime {
        self.idle.asleep.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        let Some(mut e) = self.try_lock() else {
            return Bedtime::Busy;
        };
        for i in 0..e.port_count() {
            e.port_at_mut(i).rx_arm();
        }
        fence(Ordering::SeqCst);
        let _ = e.core_mut().take_earliest_new_deadline();
        if e.poll() > 0 || e.core().has_pending_work() {
            return Bedtime::Work;
        }
        let deadline = e.core().next_deadline();
        self.idle
            .until
            .store(deadline.unwrap_or(u64::MAX), Ordering::Release);
        Bedtime::Sleep(match deadline {
            Some(d) => Duration::from_nanos(d.saturating_sub(e.port().now_ns())),
            None => MAX_SLEEP,
        })
    }
}
