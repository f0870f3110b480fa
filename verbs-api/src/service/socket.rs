//! The control socket: a `SOCK_SEQPACKET` Unix socket, so each message is one datagram and
//! the descriptors passed with it (`SCM_RIGHTS`) arrive with exactly that message.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::proto::{MAX_FDS, MAX_MESSAGE};

/// One end of a connection between a program and the service.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// Connects to the service listening at `path`.
    pub fn connect(path: &Path) -> io::Result<Self> {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
        Ok(Self { fd })
    }

    /// A connected pair (tests, and a service serving a program in its own process).
    pub fn pair() -> io::Result<(Self, Self)> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((Self { fd: a }, Self { fd: b }))
    }

    /// Sends one message with `fds` attached.
    pub fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if bytes.len() > MAX_MESSAGE || fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message too large",
            ));
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(fds));
        }
        let n = rustix::net::sendmsg(
            &self.fd,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        if n != bytes.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
        }
        Ok(())
    }

    /// Receives one message into `buf`: its length and the descriptors that came with it.
    /// `Ok(None)` when the other side has closed. A message longer than [`MAX_MESSAGE`] or
    /// with more than [`MAX_FDS`] descriptors is an error (the descriptors that did come
    /// are closed).
    pub fn recv(&self, buf: &mut [u8; MAX_MESSAGE]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
        self.recv_with(buf, RecvFlags::empty()).map(|m| m.flatten())
    }

    /// [`recv`](Self::recv) without waiting: `Ok(Some(None))` when no message is there.
    #[allow(clippy::type_complexity)]
    pub fn try_recv(
        &self,
        buf: &mut [u8; MAX_MESSAGE],
    ) -> io::Result<Option<Option<(usize, Vec<OwnedFd>)>>> {
        match self.recv_with(buf, RecvFlags::DONTWAIT) {
            Ok(Some(m)) => Ok(m.map(Some)),
            Ok(None) => Ok(Some(None)),
            Err(e) => Err(e),
        }
    }

    /// One message: `Ok(None)` when none waits (with `DONTWAIT`), `Ok(Some(None))` when
    /// the other side has closed.
    #[allow(clippy::type_complexity)]
    fn recv_with(
        &self,
        buf: &mut [u8; MAX_MESSAGE],
        flags: RecvFlags,
    ) -> io::Result<Option<Option<(usize, Vec<OwnedFd>)>>> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = loop {
            match rustix::net::recvmsg(
                &self.fd,
                &mut [IoSliceMut::new(buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC | flags,
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                r => break r?,
            }
        };
        let mut fds = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        if msg.flags.contains(ReturnFlags::TRUNC) || msg.flags.contains(ReturnFlags::CTRUNC) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message truncated",
            ));
        }
        if msg.bytes == 0 && fds.is_empty() {
            return Ok(Some(None));
        }
        Ok(Some(Some((msg.bytes, fds))))
    }

    /// Stops both directions: the other side's next receive sees the end.
    pub fn shutdown(&self) {
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The service's listening socket; the path is removed on drop.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Listener {
    /// Listens at `path` (a stale socket file there is replaced), readable and writable by
    /// the users `mode` allows: the file's permissions decide who may connect.
    pub fn bind(path: &Path, mode: u32) -> io::Result<Self> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.file_type().is_socket() {
                // A live service answers; only a dead one's file is replaced.
                if Self::alive(path) {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("a service already listens at {}", path.display()),
                    ));
                }
                std::fs::remove_file(path)?;
            }
        }
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        rustix::net::listen(&fd, 64)?;
        Ok(Self {
            fd,
            path: path.to_owned(),
        })
    }

    fn alive(path: &Path) -> bool {
        Channel::connect(path).is_ok()
    }

    /// The next program waiting to connect, if any (the socket does not block).
    pub fn accept_nonblocking(&self) -> io::Result<Option<Channel>> {
        loop {
            match rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                r => return Ok(Some(Channel { fd: r? })),
            }
        }
    }

    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops listening.
    pub fn shutdown(&self) {
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An eventfd: the doorbell a program rings when the service sleeps.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new doorbell.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            fd: rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )?,
        })
    }

    /// The doorbell passed over as `fd`.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// Rings it.
    pub fn ring(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Clears it.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Waits up to `timeout` for `fd` to be readable: true when it is.
pub(crate) fn readable(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> bool {
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut fds, Some(&ts)).is_ok_and(|n| n > 0)
}
