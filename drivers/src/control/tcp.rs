//! TCP through a port's own address: the out-of-band channel perftest-style tools swap QP
//! endpoints over, for ports no kernel serves.
//!
//! The types mirror `std::net` ([`ControlListener::accept`], [`ControlStream`] with `Read` and
//! `Write`) so a caller can hold either behind one enum. They block by waiting for the engine
//! to poll smoltcp: some thread must turn the engine (an engine thread, or the caller between
//! non-blocking calls), or every wait ends in its timeout.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp::{Socket, SocketBuffer, State};
use smoltcp::wire::{IpAddress, IpEndpoint};

use super::{Shared, Smol};

/// Bytes each socket buffers each way; the exchange sends a few hundred.
const BUFFER: usize = 64 * 1024;

/// How long a wait sleeps between looks at its socket: short beside a poll-mode round trip
/// through the kernel, long enough to leave the core to the engine.
const NAP: Duration = Duration::from_micros(20);

/// A handle on a [`super::ControlPlane`]'s TCP, for any thread.
#[derive(Clone)]
pub struct ControlHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ControlHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlHandle").finish_non_exhaustive()
    }
}

fn socket() -> Socket<'static> {
    let mut s = Socket::new(
        SocketBuffer::new(vec![0; BUFFER]),
        SocketBuffer::new(vec![0; BUFFER]),
    );
    // Small request/response messages: no Nagle, no delayed ACK (as TCP_NODELAY).
    s.set_nagle_enabled(false);
    s.set_ack_delay(None);
    s
}

impl ControlHandle {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Runs `f` on smoltcp's state, then asks the engine to poll smoltcp soon.
    fn with<R>(&self, f: impl FnOnce(&mut Smol) -> R) -> R {
        let r = f(&mut self.shared.smol());
        self.shared.kick.store(true, Ordering::Release);
        r
    }

    /// Waits until `ready` answers, or `timeout` passes (`None`: forever).
    fn wait<R>(
        &self,
        timeout: Option<Duration>,
        what: &str,
        mut ready: impl FnMut(&mut Smol) -> Option<io::Result<R>>,
    ) -> io::Result<R> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.with(&mut ready) {
                return r;
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what}: no answer within {timeout:?} (is the engine turning?)"),
                ));
            }
            std::thread::sleep(NAP);
        }
    }

    /// Listens on TCP `port` at the port's address (any address it has).
    pub fn listen(&self, port: u16) -> io::Result<ControlListener> {
        let handle = self.with(|s| listen_socket(s, port))?;
        Ok(ControlListener {
            control: self.clone(),
            port,
            handle,
        })
    }

    /// Connects to `remote`, waiting up to `timeout`. A peer that answers with a reset (no
    /// listener) fails at once with `ConnectionRefused`, as a kernel socket does.
    pub fn connect(&self, remote: SocketAddr, timeout: Duration) -> io::Result<ControlStream> {
        let handle = self.with(|s| {
            let local = s.next_port;
            s.next_port = if local == u16::MAX { 49152 } else { local + 1 };
            let mut sock = socket();
            sock.connect(
                s.iface.context(),
                IpEndpoint::new(IpAddress::from(remote.ip()), remote.port()),
                local,
            )
            .map_err(|e| io::Error::new(io::ErrorKind::AddrNotAvailable, e.to_string()))?;
            Ok::<_, io::Error>(s.sockets.add(sock))
        })?;
        let stream = ControlStream::new(self.clone(), handle);
        let what = format!("connecting to {remote}");
        self.wait(Some(timeout), &what, |s| {
            let sock = s.sockets.get::<Socket<'_>>(handle);
            match sock.state() {
                State::Established => Some(Ok(())),
                State::SynSent | State::SynReceived => None,
                _ => Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("{remote} refused the connection"),
                ))),
            }
        })?;
        Ok(stream)
    }
}

fn listen_socket(s: &mut Smol, port: u16) -> io::Result<SocketHandle> {
    let mut sock = socket();
    sock.listen(port)
        .map_err(|e| io::Error::new(io::ErrorKind::AddrNotAvailable, e.to_string()))?;
    Ok(s.sockets.add(sock))
}

/// A TCP listener at the port's address. smoltcp sockets take one connection each, so every
/// accept hands its socket to the stream and opens a fresh one on the same port.
pub struct ControlListener {
    control: ControlHandle,
    port: u16,
    handle: SocketHandle,
}

impl ControlListener {
    /// Waits for a peer (up to `timeout`; `None`: forever).
    pub fn accept(&mut self, timeout: Option<Duration>) -> io::Result<(ControlStream, SocketAddr)> {
        let handle = self.handle;
        let port = self.port;
        let remote = self
            .control
            .wait(timeout, &format!("accepting on TCP port {port}"), |s| {
                let sock = s.sockets.get_mut::<Socket<'_>>(handle);
                match sock.state() {
                    State::Established | State::CloseWait => {
                        let ep = sock.remote_endpoint()?;
                        Some(Ok(SocketAddr::new(ep.addr.into(), ep.port)))
                    }
                    // A peer that reset during the handshake: listen again.
                    State::Closed => match sock.listen(port) {
                        Ok(()) => None,
                        Err(e) => Some(Err(io::Error::new(
                            io::ErrorKind::AddrNotAvailable,
                            e.to_string(),
                        ))),
                    },
                    _ => None,
                }
            })?;
        self.handle = self.control.with(|s| listen_socket(s, port))?;
        Ok((ControlStream::new(self.control.clone(), handle), remote))
    }

    /// The TCP port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        let handle = self.handle;
        self.control.with(|s| {
            s.sockets.get_mut::<Socket<'_>>(handle).abort();
            s.closing.push(handle);
        });
    }
}

/// One TCP connection through the port's address.
pub struct ControlStream {
    control: ControlHandle,
    handle: SocketHandle,
    read_timeout: Option<Duration>,
    nonblocking: bool,
}

impl std::fmt::Debug for ControlStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlStream")
            .field("read_timeout", &self.read_timeout)
            .field("nonblocking", &self.nonblocking)
            .finish_non_exhaustive()
    }
}

impl ControlStream {
    fn new(control: ControlHandle, handle: SocketHandle) -> Self {
        Self {
            control,
            handle,
            read_timeout: None,
            nonblocking: false,
        }
    }

    /// How long a read waits (`None`: forever), as `TcpStream::set_read_timeout`.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    /// Reads and writes return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&mut self, on: bool) {
        self.nonblocking = on;
    }

    /// True when a read would return at once: data waits, or the peer closed.
    pub fn readable(&self) -> bool {
        let h = self.handle;
        self.control.with(|s| {
            let sock = s.sockets.get::<Socket<'_>>(h);
            sock.can_recv() || !sock.may_recv()
        })
    }

    /// Ends the sending half: waits until the peer acknowledged every byte written
    /// ([`Write::flush`]), then sends FIN and waits up to `linger` for the peer to
    /// acknowledge that too. A FIN comes after the last byte was acknowledged, so a peer
    /// that reads to the end of the stream before it exits (as `TcpStream` readers do)
    /// never takes its acknowledgement of our data with it: a port's TCP lives in its
    /// process's engine, and a frame still in a ring when that process ends is lost.
    /// Only the flush can fail; a FIN left unacknowledged after `linger` is not an error.
    pub fn shutdown_write(&mut self, linger: Duration) -> io::Result<()> {
        self.flush()?;
        let h = self.handle;
        self.control
            .with(|s| s.sockets.get_mut::<Socket<'_>>(h).close());
        let _ = self.control.wait(Some(linger), "closing", |s| {
            let state = s.sockets.get::<Socket<'_>>(h).state();
            matches!(
                state,
                State::FinWait2 | State::TimeWait | State::Closed | State::LastAck
            )
            .then_some(Ok(()))
        });
        Ok(())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        let h = self.handle;
        self.control.with(|s| {
            s.sockets
                .get::<Socket<'_>>(h)
                .remote_endpoint()
                .map(|ep| SocketAddr::new(ep.addr.into(), ep.port))
        })
    }

    fn io<R>(
        &self,
        timeout: Option<Duration>,
        what: &str,
        mut step: impl FnMut(&mut Socket<'static>) -> Option<io::Result<R>>,
    ) -> io::Result<R> {
        let h = self.handle;
        if self.nonblocking {
            return self
                .control
                .with(|s| step(s.sockets.get_mut::<Socket<'_>>(h)))
                .unwrap_or_else(|| Err(io::Error::new(io::ErrorKind::WouldBlock, "would block")));
        }
        self.control
            .wait(timeout, what, |s| step(s.sockets.get_mut::<Socket<'_>>(h)))
    }
}

impl Read for ControlStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.io(self.read_timeout, "reading from the peer", |sock| {
            if sock.can_recv() {
                return Some(
                    sock.recv_slice(buf)
                        .map_err(|e| io::Error::new(io::ErrorKind::ConnectionReset, e.to_string())),
                );
            }
            match sock.state() {
                State::Closed => Some(Err(io::ErrorKind::ConnectionReset.into())),
                // The peer's FIN: end of stream.
                _ if !sock.may_recv() => Some(Ok(0)),
                _ => None,
            }
        })
    }
}

impl Write for ControlStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // Writes wait as long as TCP keeps trying; smoltcp gives up on a dead peer by itself
        // only with a timeout set, so bound the wait here.
        self.io(
            Some(Duration::from_secs(30)),
            "writing to the peer",
            |sock| {
                if !sock.may_send() {
                    return Some(Err(io::ErrorKind::BrokenPipe.into()));
                }
                if sock.can_send() {
                    return Some(
                        sock.send_slice(buf)
                            .map_err(|_| io::ErrorKind::BrokenPipe.into()),
                    );
                }
                None
            },
        )
    }

    /// Waits until the peer acknowledged every byte written. A kernel socket's data outlives
    /// its process; this one's lives in the engine's smoltcp, so a process that writes its
    /// last message and exits must flush first.
    fn flush(&mut self) -> io::Result<()> {
        if self.nonblocking {
            return Ok(());
        }
        self.io(
            Some(Duration::from_secs(30)),
            "flushing to the peer",
            |sock| {
                if sock.send_queue() == 0 {
                    Some(Ok(()))
                } else if !sock.may_send() && sock.state() == State::Closed {
                    Some(Err(io::ErrorKind::BrokenPipe.into()))
                } else {
                    None
                }
            },
        )
    }
}

impl Drop for ControlStream {
    fn drop(&mut self) {
        let handle = self.handle;
        self.control.with(|s| {
            s.sockets.get_mut::<Socket<'_>>(handle).close();
            s.closing.push(handle);
        });
    }
}
