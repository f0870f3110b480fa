//! Memory two processes share: a memfd, sealed so that neither can change its size, mapped
//! `MAP_SHARED` into each.
//!
//! The service maps regions a program created and passed over its socket, and a program is
//! not trusted. A region the other side could shrink would turn the service's next read
//! beyond the new end into `SIGBUS`, so [`Region::from_fd`] accepts only a memfd whose size
//! is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) and at least as large as the
//! layout the caller expects; from then on the mapping stays valid for as long as this side
//! keeps it, whatever the other side does.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use thiserror::Error;

/// The seals a shared region must carry: its size can no longer change, nor its seals.
pub(super) const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Why a region could not be made or taken.
#[derive(Debug, Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("{call}: {source}")]
    Os {
        /// The call.
        call: &'static str,
        /// What it said.
        source: std::io::Error,
    },
    /// A region of no bytes, or more than the address space holds.
    #[error("a shared region of {0} bytes cannot be made")]
    BadSize(u64),
    /// The fd's size can still change (it is not a sealed memfd).
    #[error("the shared region is not sealed against resizing (seals {0:#x})")]
    Unsealed(libc::c_int),
    /// Memory to be shared is not all private, writable and mapped (see `adopt`).
    #[error("{len} bytes at {addr:#x} are not all private, writable memory of this process")]
    NotPrivate {
        /// The buffer's address.
        addr: usize,
        /// Its length.
        len: u64,
    },
    /// The fd holds fewer bytes than the layout needs.
    #[error("the shared region holds {have} bytes, {need} needed")]
    TooSmall {
        /// Its size.
        have: u64,
        /// The size the caller needs.
        need: u64,
    },
}

fn os(call: &'static str) -> ShmError {
    ShmError::Os {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// Shared memory mapped in this process: what a registration over another process's pages
/// keeps alive for as long as it uses them.
pub trait Mapped: Send + Sync + std::fmt::Debug {
    /// The first byte.
    fn as_ptr(&self) -> *mut u8;
    /// Its size in bytes.
    fn len(&self) -> usize;
    /// Never true: a mapping has at least one byte.
    fn is_empty(&self) -> bool {
        false
    }
}

impl Mapped for Region {
    fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// A sealed memfd mapped read-write and shared. Unmapped on drop; the fd stays open with it,
/// to be passed on.
#[derive(Debug)]
pub struct Region {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access from this crate goes through
// atomics (`ring`), and a `Region` hands out no references into it.
unsafe impl Send for Region {}
// SAFETY: as above: shared access is by atomics only.
unsafe impl Sync for Region {}

impl Region {
    /// A new region of `len` zeroed bytes, sealed, named `name` (seen in /proc/PID/fd).
    pub fn new(name: &CStr, len: usize) -> Result<Self, ShmError> {
        if len == 0 || len > isize::MAX as usize {
            return Err(ShmError::BadSize(len as u64));
        }
        // SAFETY: `name` is a valid C string; the flags are memfd_create's.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate and fcntl on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
            return Err(os("ftruncate"));
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
            return Err(os("fcntl(F_ADD_SEALS)"));
        }
        Self::map(fd, len)
    }

    /// Takes a region the other side made and passed over: `fd` must be a memfd sealed
    /// against resizing and hold at least `need` bytes; all of it is mapped.
    pub fn from_fd(fd: OwnedFd, need: usize) -> Result<Self, ShmError> {
        // SAFETY: F_GET_SEALS on a descriptor we own; fails (EINVAL) on anything but a memfd.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(ShmError::Unsealed(0));
        }
        if seals & SEALS != SEALS {
            return Err(ShmError::Unsealed(seals));
        }
        // SAFETY: stat is plain data, filled by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on a descriptor we own, into a stat we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(os("fstat"));
        }
        let have = st.st_size as u64;
        if have < need as u64 {
            return Err(ShmError::TooSmall {
                have,
                need: need as u64,
            });
        }
        let len = usize::try_from(have)
            .ok()
            .filter(|&l| l > 0 && l <= isize::MAX as usize)
            .ok_or(ShmError::BadSize(have))?;
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Self, ShmError> {
        // SAFETY: a fresh shared mapping of a descriptor we own, `len` bytes, which the seals
        // keep backed for the mapping's lifetime.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| os("mmap"))?;
        Ok(Self { fd, base, len })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The descriptor, borrowed (to pass to the other side, or to map a piece of it).
    pub fn fd_borrowed(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// The descriptor, to pass to the other side (`SCM_RIGHTS`).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Unmaps the region here and gives back its descriptor, for memory this side no longer
    /// reads but another mapping (or process) keeps using.
    pub fn into_fd(self) -> OwnedFd {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: unmaps exactly the mapping `map` made; `this` is never used or dropped
        // again, so nothing refers to the mapping after this.
        unsafe {
            libc::munmap(this.base.as_ptr().cast(), this.len);
        }
        // SAFETY: moves the descriptor out of `this`, which is not dropped (ManuallyDrop),
        // so the descriptor has one owner.
        unsafe { std::ptr::read(&this.fd) }
    }

    /// A second descriptor for the same memory, to hand over while this side keeps its own.
    pub fn dup_fd(&self) -> Result<OwnedFd, ShmError> {
        self.fd.try_clone().map_err(|source| ShmError::Os {
            call: "dup",
            source,
        })
    }

    /// Stores `words` at byte `offset` (8-aligned), one atomic store each, as the other side
    /// may at any time: `false`, storing nothing, when they do not lie in the region. For
    /// words outside the rings (a doorbell), and for tests and fuzzers playing a hostile peer.
    pub fn store_words(&self, offset: usize, words: &[u64]) -> bool {
        let fits = offset.is_multiple_of(8)
            && words
                .len()
                .checked_mul(8)
                .and_then(|n| n.checked_add(offset))
                .is_some_and(|end| end <= self.len);
        if !fits {
            return false;
        }
        for (i, &w) in words.iter().enumerate() {
            // SAFETY: checked above to lie in the mapping, which lives as long as `self`;
            // 8-aligned (the region is page-aligned); accessed atomically only.
            let a = unsafe {
                &*self
                    .base
                    .as_ptr()
                    .add(offset + 8 * i)
                    .cast::<std::sync::atomic::AtomicU64>()
            };
            a.store(w, std::sync::atomic::Ordering::Relaxed);
        }
        true
    }

    /// The first byte. Valid for [`len`](Self::len) bytes while `self` lives; the other
    /// side may write any of them at any time, so only atomic access is sound.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// The mapping's first byte, for a registration that keeps this region alive for as
    /// long as it uses the pointer (the verbs API's memory regions over shared memory).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The word at byte `offset` (8-aligned), if it lies in the region: for flags beside the
    /// rings, only ever accessed atomically.
    fn word(&self, offset: usize) -> Option<&std::sync::atomic::AtomicU64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: the word lies inside the mapping (checked above), which lives as long as
        // `self`; it is 8-aligned (the mapping is page-aligned) and only accessed atomically.
        Some(unsafe {
            &*self
                .base
                .as_ptr()
                .add(offset)
                .cast::<std::sync::atomic::AtomicU64>()
        })
    }

    /// The word at byte `offset` (8-aligned), loaded atomically with `order`; `None` outside
    /// the region. For flags beside the rings (the service's sleeping flag).
    pub fn load_word(&self, offset: usize, order: std::sync::atomic::Ordering) -> Option<u64> {
        Some(self.word(offset)?.load(order))
    }

    /// Swaps `v` into the word at byte `offset` (8-aligned): the old value, `None` outside
    /// the region.
    pub fn swap_word(&self, offset: usize, v: u64) -> Option<u64> {
        Some(
            self.word(offset)?
                .swap(v, std::sync::atomic::Ordering::AcqRel),
        )
    }

    /// Adds `v` to the word at byte `offset` (8-aligned), wrapping: the old value, `None`
    /// outside the region.
    pub fn add_word(&self, offset: usize, v: u64) -> Option<u64> {
        Some(
            self.word(offset)?
                .fetch_add(v, std::sync::atomic::Ordering::AcqRel),
        )
    }

    /// Stores `v` at byte `offset` (8-aligned) atomically with `order`: `false` outside
    /// the region.
    pub fn store_word(&self, offset: usize, v: u64, order: std::sync::atomic::Ordering) -> bool {
        self.word(offset).map(|w| w.store(v, order)).is_some()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; nothing borrows into it past `self`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
