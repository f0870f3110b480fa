//! Several pieces of sealed memfds mapped one after another as one range: the service's view
//! of a registration whose pages the program moved in several pieces (a buffer that shares
//! pages with one registered before it reuses that one's memfd for those pages, and only
//! its other pages move; see the client's registry).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use super::region::{Mapped, ShmError, SEALS};

/// Pieces at most in one stitched mapping.
pub const MAX_PIECES: usize = 8;

/// A piece: `len` bytes at byte `offset` of a memfd (both whole pages).
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    /// The memfd.
    pub fd: BorrowedFd<'a>,
    /// Where the piece starts in it.
    pub offset: u64,
    /// Its bytes.
    pub len: u64,
}

/// The pieces, mapped shared, one after another; unmapped on drop.
#[derive(Debug)]
pub struct Stitched {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory, reached only through the MR accessor and by address.
unsafe impl Send for Stitched {}
// SAFETY: as above.
unsafe impl Sync for Stitched {}

fn os(call: &'static str) -> ShmError {
    ShmError::Os {
        call,
        source: std::io::Error::last_os_error(),
    }
}

impl Stitched {
    /// Maps `pieces` one after another. Each must be a memfd sealed against resizing that
    /// holds its piece, at page-aligned offsets and lengths; at most [`MAX_PIECES`].
    pub fn new(pieces: &[Piece<'_>]) -> Result<Self, ShmError> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        if pieces.is_empty() || pieces.len() > MAX_PIECES {
            return Err(ShmError::BadSize(pieces.len() as u64));
        }
        let mut total = 0usize;
        for p in pieces {
            let (Ok(off), Ok(len)) = (usize::try_from(p.offset), usize::try_from(p.len)) else {
                return Err(ShmError::BadSize(p.len));
            };
            if len == 0 || !off.is_multiple_of(page) || !len.is_multiple_of(page) {
                return Err(ShmError::BadSize(p.len));
            }
            // SAFETY: F_GET_SEALS on a descriptor the caller lends us.
            let seals = unsafe { libc::fcntl(p.fd.as_raw_fd(), libc::F_GET_SEALS) };
            if seals < 0 || seals & SEALS != SEALS {
                return Err(ShmError::Unsealed(seals.max(0)));
            }
            // SAFETY: stat is plain data, filled by fstat.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat on a lent descriptor into a stat we own.
            if unsafe { libc::fstat(p.fd.as_raw_fd(), &mut st) } < 0 {
                return Err(os("fstat"));
            }
            let need = p
                .offset
                .checked_add(p.len)
                .ok_or(ShmError::BadSize(p.len))?;
            if (st.st_size as u64) < need {
                return Err(ShmError::TooSmall {
                    have: st.st_size as u64,
                    need,
                });
            }
            total = total.checked_add(len).ok_or(ShmError::BadSize(p.len))?;
        }
        if total > isize::MAX as usize {
            return Err(ShmError::BadSize(total as u64));
        }
        // SAFETY: a fresh reservation of `total` bytes nobody else knows of.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| os("mmap"))?;
        let this = Self { base, len: total };
        let mut at = 0usize;
        for p in pieces {
            let len = p.len as usize;
            // SAFETY: replaces pages of our own reservation (inside `this`, checked to fit
            // above) with the piece's, shared; the seals keep them backed.
            let got = unsafe {
                libc::mmap(
                    this.base.as_ptr().add(at).cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    p.fd.as_raw_fd(),
                    p.offset as libc::off_t,
                )
            };
            if got == libc::MAP_FAILED {
                return Err(os("mmap"));
            }
            at += len;
        }
        Ok(this)
    }
}

impl Mapped for Stitched {
    fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Stitched {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range `new` reserved and filled; nothing refers to it
        // once the owner drops it.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::shm::Region;

    #[test]
    fn pieces_of_two_memfds_map_end_to_end_and_writes_reach_both() {
        let a = Region::new(c"ferroce-test-a", 3 * 4096).unwrap();
        let b = Region::new(c"ferroce-test-b", 2 * 4096).unwrap();
        let s = Stitched::new(&[
            Piece {
                fd: a.fd_borrowed(),
                offset: 4096,
                len: 2 * 4096,
            },
            Piece {
                fd: b.fd_borrowed(),
                offset: 0,
                len: 4096,
            },
        ])
        .unwrap();
        assert_eq!(Mapped::len(&s), 3 * 4096);
        // The third page of the stitched range is b's first; the first is a's second.
        a.store_word(4096, 0x1111, Ordering::Relaxed);
        b.store_word(8, 0x2222, Ordering::Relaxed);
        let word = |at: usize| {
            // SAFETY: inside the stitched mapping, 8-aligned, alive while `s` is.
            unsafe { &*s.as_ptr().add(at).cast::<std::sync::atomic::AtomicU64>() }
                .load(Ordering::Relaxed)
        };
        assert_eq!(word(0), 0x1111);
        assert_eq!(word(2 * 4096 + 8), 0x2222);
    }

    #[test]
    fn unsealed_short_or_misaligned_pieces_are_refused() {
        let a = Region::new(c"ferroce-test-a", 2 * 4096).unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        for pieces in [
            vec![Piece {
                fd: file.as_fd(),
                offset: 0,
                len: 4096,
            }],
            vec![Piece {
                fd: a.fd_borrowed(),
                offset: 4096,
                len: 2 * 4096,
            }],
            vec![Piece {
                fd: a.fd_borrowed(),
                offset: 100,
                len: 4096,
            }],
            vec![Piece {
                fd: a.fd_borrowed(),
                offset: 0,
                len: 0,
            }],
            vec![],
        ] {
            assert!(Stitched::new(&pieces).is_err());
        }
    }
}
