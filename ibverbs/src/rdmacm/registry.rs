//! Several processes on one interface. AF_PACKET hands every socket on an interface every
//! frame, so each ferroce process there runs an agent that sees every CM MAD, for every
//! process's listeners and connections. The kernel's rdma_cm has one agent per port; this
//! registry makes the processes act as one:
//!
//! - a listener is registered per address and service (a file naming its process), so two
//!   processes cannot listen on one service (`EADDRINUSE`, as two kernel ids cannot), and an
//!   agent can tell a REQ for another process's listener from one nobody listens for;
//! - one process per address is the *answerer* (it holds an exclusive `flock` on the
//!   address's lock file; the kernel drops it when the process ends, and the next to ask
//!   takes it over): only it sends the REJ "invalid service ID" for a request nobody
//!   listens for, and the DREP for a DREQ no agent holds a connection for.
//!
//! The files live under `/dev/shm/ferroce-cm/` (shared memory: gone at reboot), one
//! directory per interface and address.

use std::ffi::c_int;
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use ferroce_verbs::cm::Unclaimed;

/// The registry of one address (an interface's IP).
pub(crate) struct Registry {
    dir: PathBuf,
    /// The answerer's lock, once this process holds it.
    lock: std::sync::Mutex<Option<fs::File>>,
}

/// True when process `pid` exists.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Registry {
    /// The registry of `ip` on `iface` (or on a port without a Linux interface), made if
    /// it does not exist.
    pub(crate) fn new(iface: Option<&str>, ip: IpAddr) -> Self {
        let dir =
            PathBuf::from("/dev/shm/ferroce-cm").join(format!("{}-{ip}", iface.unwrap_or("port")));
        let _ = fs::create_dir_all(&dir);
        Self {
            dir,
            lock: std::sync::Mutex::new(None),
        }
    }

    fn service_file(&self, svc: u64) -> PathBuf {
        self.dir.join(format!("service-{svc:016x}"))
    }

    /// The process listening on `svc`, if one lives.
    fn listener(&self, svc: u64) -> Option<i32> {
        let pid: i32 = fs::read_to_string(self.service_file(svc))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        alive(pid).then_some(pid)
    }

    /// Registers this process's listener on `svc`; `EADDRINUSE` when another live
    /// process has it.
    pub(crate) fn listen(&self, svc: u64) -> Result<(), c_int> {
        let me = std::process::id() as i32;
        let path = self.service_file(svc);
        for _ in 0..2 {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{me}");
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    match self.listener(svc) {
                        Some(pid) if pid != me => return Err(libc::EADDRINUSE),
                        // A file left by a process that ended (or by us): take it over.
                        _ => {
                            let _ = fs::remove_file(&path);
                        }
                    }
                }
                // No shared memory to register in: this process alone decides.
                Err(_) => return Ok(()),
            }
        }
        Err(libc::EADDRINUSE)
    }

    /// Removes this process's listener on `svc`.
    pub(crate) fn stop_listening(&self, svc: u64) {
        if self.listener(svc) == Some(std::process::id() as i32) {
            let _ = fs::remove_file(self.service_file(svc));
        }
    }

    /// True when this process answers for the address: it holds the lock, or takes it now.
    fn answerer(&self) -> bool {
        let mut held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_some() {
            return true;
        }
        let Ok(f) = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join("answerer"))
        else {
            // No shared memory: alone, as far as this process can tell.
            return true;
        };
        // SAFETY: a non-blocking lock on our own open file.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            *held = Some(f);
            true
        } else {
            false
        }
    }

    /// The agent's policy: a request is answered only by the answerer and only when no
    /// live process listens on its service; a DREQ nobody holds, only by the answerer.
    pub(crate) fn answers(&self, u: Unclaimed) -> bool {
        match u {
            Unclaimed::Service(svc) => self.listener(svc).is_none() && self.answerer(),
            Unclaimed::Connection(_) => self.answerer(),
        }
    }
}
