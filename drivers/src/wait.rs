//! Sleeping until a port has frames or someone wants the engine.
//!
//! An engine thread that has found nothing to do for a while waits here instead of spinning.
//! On a machine with fewer cores than busy threads (two processes, each a program thread and
//! an engine thread, on two cores) a spinning engine thread holds a core a program needs,
//! and a frame that arrives for it waits for the scheduler's next time slice, milliseconds
//! away. A sleeping one gives its core away, and when the kernel wakes it for a frame it is
//! scheduled ahead of the spinners, having used little CPU.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An eventfd: a descriptor any thread makes readable with [`notify`](Self::notify), for
/// waking a sleeper whose other descriptors stay quiet (work posted to a queue, a deadline
/// moved earlier, a stop request).
#[derive(Debug)]
pub struct Wakeup {
    fd: OwnedFd,
}

impl Wakeup {
    /// A new, quiet wakeup.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a negative return is an error, anything else a
        // descriptor we now own.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    /// Makes the descriptor readable (until [`drain`](Self::drain)).
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one` to our eventfd. A full counter (EAGAIN) means
        // it is readable already, which is all a notification asks.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&raw const one).cast(),
                core::mem::size_of::<u64>(),
            )
        };
    }

    /// Makes the descriptor quiet again.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into `v`; EAGAIN (already quiet) is fine.
        let _ = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&raw mut v).cast(),
                core::mem::size_of::<u64>(),
            )
        };
    }

    /// The descriptor, for [`wait_readable`].
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` has passed (`None`: no limit); true when
/// one is readable. A signal ends the wait early (false), which the caller treats as a
/// spurious wakeup.
pub fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<bool> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 6];
    assert!(
        fds.len() <= pfds.len(),
        "wait_readable takes at most six descriptors"
    );
    for (p, &fd) in pfds.iter_mut().zip(fds) {
        p.fd = fd;
    }
    let pfds = &mut pfds[..fds.len()];
    // ppoll, not poll: a timeout in nanoseconds, where poll's milliseconds would round a
    // 200 µs nap up to a whole millisecond.
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a live array of `pfds.len()` pollfd structures the kernel fills in;
    // `ts_ptr` is null or points at `ts`, alive for the call; no signal mask is passed.
    let rc = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            ts_ptr,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        return Ok(false);
    }
    Ok(rc > 0)
}

/// Asks the scheduler for a short time slice for the calling thread (Linux 6.12 and later,
/// EEVDF: `sched_setattr` with `sched_runtime` on a normal thread; no privilege needed).
///
/// A thread that sleeps most of the time and must run soon after it is woken (an engine
/// thread woken by a frame) then gets an earlier virtual deadline than threads that spin
/// through whole slices, so the scheduler runs it at once instead of after the running
/// thread's slice. It does not get more CPU: its share is unchanged, only cut finer. Older
/// kernels refuse the request (an error the caller may ignore) and keep the default slice.
pub fn request_short_slice(slice: Duration) -> io::Result<()> {
    // SAFETY: getpriority takes no pointers. errno is not checked: -1 is a valid nice value,
    // and a failure leaves 0, the default, which is what we would set anyway.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    request_nice(nice, slice)
}

/// Puts the calling thread in the normal class at `nice` (-20 to 19; below the thread's
/// current value needs CAP_SYS_NICE or RLIMIT_NICE) with the time slice `slice` where the
/// kernel takes one (Linux 6.12 and later; see [`request_short_slice`]).
pub fn request_nice(nice: i32, slice: Duration) -> io::Result<()> {
    /// `struct sched_attr` (include/uapi/linux/sched/types.h), the fields up to
    /// `sched_util_max` (size 56).
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
        util_min: u32,
        util_max: u32,
    }
    let attr = SchedAttr {
        size: core::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: slice.as_nanos().min(u128::from(u64::MAX)) as u64,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: sched_setattr(0, attr, 0) reads `attr.size` bytes of the live struct above
    // for the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts the calling thread in the real-time class `SCHED_FIFO` at `priority` (1 is the
/// lowest), reset to the normal class in any child it forks. A woken real-time thread runs at
/// once, ahead of every normal thread, instead of waiting for a spinning thread's time slice
/// to end. Needs CAP_SYS_NICE or an RLIMIT_RTPRIO at least `priority` (EPERM otherwise).
///
/// A real-time thread that never sleeps would keep its CPU from every normal thread until the
/// kernel's real-time throttling (`sched_rt_runtime_us`, 95 % by default) stops it; the
/// caller bounds its own running time (see [`leave_realtime`]).
pub fn request_realtime(priority: i32) -> io::Result<()> {
    set_scheduler(libc::SCHED_FIFO, priority)
}

/// Puts the calling thread back in the normal class (it ran too long at real-time priority),
/// with the short time slice [`request_short_slice`] asks for where the kernel grants it.
pub fn leave_realtime(slice: Duration) -> io::Result<()> {
    set_scheduler(libc::SCHED_OTHER, 0)?;
    let _ = request_short_slice(slice);
    Ok(())
}

/// `sched_setscheduler` for the calling thread, the policy reset to normal in any child.
fn set_scheduler(policy: libc::c_int, priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler(0, ...) reads the live `param` above for the calling thread.
    let rc = unsafe {
        libc::sched_setscheduler(0, policy | libc::SCHED_RESET_ON_FORK, &raw const param)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`): time it ran, not time it
/// was runnable or asleep.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the live `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    if rc < 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Option<Duration> = Some(Duration::ZERO);

    #[test]
    fn a_notified_wakeup_is_readable_until_drained() {
        let w = Wakeup::new().unwrap();
        assert!(!wait_readable(&[w.fd()], NOW).unwrap());
        w.notify();
        w.notify();
        assert!(wait_readable(&[w.fd()], NOW).unwrap());
        // Readable: a wait without a limit returns.
        assert!(wait_readable(&[w.fd()], None).unwrap());
        w.drain();
        assert!(!wait_readable(&[w.fd()], NOW).unwrap());
    }

    #[test]
    fn another_thread_wakes_a_sleeper() {
        let w = std::sync::Arc::new(Wakeup::new().unwrap());
        let w2 = w.clone();
        let h = std::thread::spawn(move || w2.notify());
        // Without a limit: only the other thread's notification ends this wait.
        assert!(wait_readable(&[w.fd()], None).unwrap());
        h.join().unwrap();
    }
}
