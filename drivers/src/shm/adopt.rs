//! Registered memory, shared without a copy on the data path: the pages holding a program's
//! buffer move onto a sealed memfd mapped at the same virtual addresses (as FreeFlow did), so
//! the program's pointers keep working and the service maps the same pages through the fd.
//! WRITEs and READs the service executes then land in the program's buffer itself.
//!
//! What it costs and changes, page by page (the unit of a mapping):
//! - The call copies the pages once (the cost of registration, per MiB, in `benches/shm.rs`).
//! - A buffer that is not page-aligned takes its whole first and last pages with it: bytes of
//!   the program's beside the buffer on those pages stay where they are, with the same
//!   contents, but the service could read them too.
//! - Only private, writable memory moves (anonymous memory, the heap, the stack, a private
//!   file mapping's copy); a shared file mapping would lose its file, and is refused, as is a
//!   range with a hole or a page the program cannot write.
//! - The pages are marked `MADV_DONTFORK`, as rdma-core marks registered memory when it is
//!   made fork-safe: a child has no mapping there (shared pages in a child would let its
//!   writes reach the parent's buffer, which private memory never did).
//! - The program unmapping the range later leaves the service's mapping, and so the pages,
//!   intact until the service unmaps them: its writes land in memory nobody else sees.
//! - [`release`] (deregistration) moves the pages back to private memory, contents kept.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};

use super::region::{Region, ShmError};

/// A range of this process's memory now on a sealed memfd at the same addresses.
#[derive(Debug)]
pub struct Adopted {
    fd: OwnedFd,
    /// The first page and the bytes of whole pages moved.
    start: usize,
    len: usize,
}

impl Adopted {
    /// The memfd, to pass to the service; its offset 0 is [`start`](Self::start).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The address of the first page moved.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The bytes moved (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Where byte `addr` of this process is in the memfd, if it was moved.
    pub fn offset_of(&self, addr: usize) -> Option<usize> {
        addr.checked_sub(self.start).filter(|&o| o < self.len)
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096)
}

fn os(call: &'static str) -> ShmError {
    ShmError::Os {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// Whether every byte of `[start, end)` is mapped private and writable in this process, by
/// /proc/self/maps (`rw-p`, no gap).
fn private_and_writable(start: usize, end: usize) -> Result<bool, ShmError> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|source| ShmError::Os {
        call: "read /proc/self/maps",
        source,
    })?;
    let mut covered = start;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if b <= covered || a >= end {
            continue;
        }
        if a > covered || !perms.starts_with("rw") || !perms.ends_with('p') {
            return Ok(false);
        }
        covered = b;
        if covered >= end {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Moves the pages holding `[addr, addr + len)` onto a new sealed memfd named `name`, mapped
/// shared at the same addresses, with their contents.
///
/// # Safety
///
/// No other thread of this process may touch those pages (the buffer, and whatever else
/// shares its first and last pages) during the call: a store between the copy and the
/// remapping would be lost. Nothing may hold a mapping-specific view of them (an `mlock`
/// made before is dropped with the old pages).
pub unsafe fn adopt(addr: *mut u8, len: usize, name: &CStr) -> Result<Adopted, ShmError> {
    let page = page_size();
    let a = addr as usize;
    let end = a
        .checked_add(len)
        .filter(|_| len > 0)
        .ok_or(ShmError::BadSize(len as u64))?;
    let start = a & !(page - 1);
    let stop = end
        .checked_add(page - 1)
        .ok_or(ShmError::BadSize(len as u64))?
        & !(page - 1);
    let bytes = stop - start;
    if !private_and_writable(start, stop)? {
        return Err(ShmError::NotPrivate {
            addr: a,
            len: len as u64,
        });
    }
    // The pages' contents in a new sealed memfd, through a mapping of its own.
    let copy = Region::new(name, bytes)?;
    // SAFETY: `[start, stop)` is mapped readable (checked above; the caller keeps other
    // threads off it), and `copy` is a separate mapping of the same length whose memfd no
    // one else has yet, so plain stores into it race with nothing.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, copy.base().as_ptr(), bytes) };
    let fd = copy.into_fd();
    // SAFETY: replaces the program's pages `[start, stop)` (private, writable, checked) with
    // the memfd's, which now hold the same bytes; MAP_FIXED over an existing mapping is the
    // documented way to do that in one step.
    let fixed = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if fixed == libc::MAP_FAILED {
        return Err(os("mmap(MAP_FIXED)"));
    }
    // SAFETY: advice on the range just mapped.
    if unsafe { libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_DONTFORK) } < 0 {
        return Err(os("madvise(MADV_DONTFORK)"));
    }
    Ok(Adopted {
        fd,
        start,
        len: bytes,
    })
}

/// A fresh anonymous mapping of `len` bytes, read-write, private or shared by `share`.
fn map_anon(len: usize, share: libc::c_int) -> Result<*mut u8, ShmError> {
    // SAFETY: a fresh anonymous mapping, aliasing nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            share | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os("mmap"));
    }
    Ok(p.cast())
}

/// Moves the pages `adopted` took back to private anonymous memory at the same addresses,
/// with their contents (deregistration): the service's mapping, if it keeps one, no longer
/// reaches the program's buffer, and a child of fork inherits the pages again.
///
/// # Safety
///
/// As for [`adopt`]: no other thread may touch the pages during the call.
pub unsafe fn release(adopted: Adopted) -> Result<(), ShmError> {
    let (start, len) = (adopted.start, adopted.len);
    let tmp = map_anon(len, libc::MAP_PRIVATE)?.cast::<libc::c_void>();
    // SAFETY: `[start, start + len)` is still the memfd's mapping `adopt` made (the caller
    // gives up `adopted`, and the program has not unmapped it while registered), `tmp` is a
    // fresh mapping of the same length, and they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, tmp.cast::<u8>(), len) };
    // SAFETY: moves the private pages onto `start`, replacing the memfd's mapping there in
    // one step (MREMAP_FIXED unmaps what was at the destination).
    let moved = unsafe {
        libc::mremap(
            tmp,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        let e = os("mremap");
        // SAFETY: the temporary mapping, which nothing uses.
        unsafe { libc::munmap(tmp, len) };
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::*;

    /// `n` bytes of fresh anonymous memory, filled with a pattern.
    fn anon(n: usize) -> *mut u8 {
        let p = map_anon(n, libc::MAP_PRIVATE).unwrap();
        for i in 0..n {
            // SAFETY: within the mapping just made.
            unsafe { *p.add(i) = (i * 7 + 3) as u8 };
        }
        p
    }

    /// A byte through the other mapping, as the service reads it.
    fn byte(r: &Region, off: usize) -> u8 {
        assert!(off < r.len());
        // SAFETY: in the region; atomic access only.
        unsafe { &*r.base().as_ptr().add(off).cast::<AtomicU8>() }.load(Ordering::Relaxed)
    }

    fn set_byte(r: &Region, off: usize, v: u8) {
        assert!(off < r.len());
        // SAFETY: as in `byte`.
        unsafe { &*r.base().as_ptr().add(off).cast::<AtomicU8>() }.store(v, Ordering::Relaxed);
    }

    #[test]
    fn a_buffer_keeps_its_bytes_and_its_address_and_the_other_side_sees_the_same_memory() {
        let page = page_size();
        let n = 16 * page;
        let p = anon(n);
        // An unaligned buffer inside: its first and last pages move whole.
        let (off, len) = (page / 2 + 5, 9 * page);
        // SAFETY: the test's own mapping; no other thread touches it.
        let ad = unsafe { adopt(p.add(off), len, c"ferroce-mr-test") }.unwrap();
        assert_eq!(ad.start(), p as usize);
        assert_eq!(ad.len(), 10 * page);
        for i in 0..n {
            // SAFETY: the test's mapping, still mapped (the moved part at the same address).
            assert_eq!(unsafe { *p.add(i) }, (i * 7 + 3) as u8, "byte {i}");
        }
        let service = Region::from_fd(ad.fd().try_clone().unwrap(), ad.len()).unwrap();
        let o = ad.offset_of(p as usize + off).unwrap();
        assert_eq!(o, off);
        assert_eq!(byte(&service, o), (off * 7 + 3) as u8);
        // A WRITE the service executes lands in the program's buffer, and back.
        set_byte(&service, o + 100, 0xee);
        // SAFETY: as above.
        assert_eq!(unsafe { *p.add(off + 100) }, 0xee);
        // SAFETY: as above.
        unsafe { *p.add(off + 200) = 0x11 };
        assert_eq!(byte(&service, o + 200), 0x11);
        assert_eq!(ad.offset_of(p as usize + 11 * page), None);
        // The program unmaps its buffer: the service's mapping stays good.
        // SAFETY: unmaps the test's own mapping, which nothing uses after this.
        assert_eq!(unsafe { libc::munmap(p.cast(), n) }, 0);
        set_byte(&service, o, 1);
        assert_eq!(byte(&service, o), 1);
        assert_eq!(byte(&service, o + 100), 0xee);
    }

    #[test]
    fn a_released_buffer_is_private_again_with_its_bytes() {
        let page = page_size();
        let n = 8 * page;
        let p = anon(n);
        // SAFETY: the test's own mapping; no other thread touches it.
        let ad = unsafe { adopt(p.add(100), 5 * page, c"ferroce-mr-release") }.unwrap();
        let service = Region::from_fd(ad.fd().try_clone().unwrap(), ad.len()).unwrap();
        set_byte(&service, 300, 0xab);
        let (start, len) = (ad.start(), ad.len());
        assert!(!private_and_writable(start, start + len).unwrap());
        // SAFETY: as above.
        unsafe { release(ad) }.unwrap();
        assert!(private_and_writable(start, start + len).unwrap());
        // SAFETY: the test's mapping, private again at the same addresses.
        assert_eq!(unsafe { *p.add(300) }, 0xab, "what the service wrote stays");
        for i in (0..n).filter(|&i| i != 300) {
            // SAFETY: as above.
            assert_eq!(unsafe { *p.add(i) }, (i * 7 + 3) as u8, "byte {i}");
        }
        // The service's mapping no longer reaches the buffer.
        set_byte(&service, 301, 0xcd);
        // SAFETY: as above.
        assert_eq!(unsafe { *p.add(301) }, (301 * 7 + 3) as u8);
        // And it can be registered again.
        // SAFETY: as above.
        let again = unsafe { adopt(p, n, c"ferroce-mr-again") }.unwrap();
        assert_eq!(again.start(), p as usize);
        // A child of fork inherits the pages once they are released.
        // SAFETY: as above.
        unsafe { release(again) }.unwrap();
        // SAFETY: the child only calls msync and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: msync inspects the range; _exit ends the child.
            unsafe {
                let r = libc::msync(p.cast(), n, libc::MS_ASYNC);
                libc::_exit(if r == 0 { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }

    #[test]
    fn heap_memory_moves_too() {
        // 40 MiB: above glibc's largest mmap threshold (32 MiB), so the allocation has pages
        // of its own. A small one shares its first and last pages with other allocations,
        // which the harness's other threads may be writing during the move.
        let mut v: Vec<u8> = (0..40 << 20).map(|i| (i % 251) as u8).collect();
        // SAFETY: this thread owns `v`, and no other allocation shares its pages (above).
        let ad = unsafe { adopt(v.as_mut_ptr(), v.len(), c"ferroce-mr-heap") }.unwrap();
        assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        let service = Region::from_fd(ad.fd().try_clone().unwrap(), ad.len()).unwrap();
        let o = ad.offset_of(v.as_ptr() as usize + 5000).unwrap();
        set_byte(&service, o, 42);
        assert_eq!(v[5000], 42);
    }

    #[test]
    fn a_child_of_fork_has_no_mapping_there() {
        let page = page_size();
        let p = anon(4 * page);
        // SAFETY: the test's own mapping.
        let ad = unsafe { adopt(p, 4 * page, c"ferroce-mr-fork") }.unwrap();
        // SAFETY: the child only calls msync and _exit (async-signal-safe) before it ends.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // msync fails with ENOMEM on an address range that is not mapped.
            // SAFETY: msync only inspects the range; _exit ends the child.
            unsafe {
                let r = libc::msync(ad.start() as *mut libc::c_void, ad.len(), libc::MS_ASYNC);
                libc::_exit(if r < 0 { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child had the pages mapped"
        );
        // The parent still has them.
        // SAFETY: as above.
        assert_eq!(unsafe { *p.add(5) }, 38);
    }

    #[test]
    fn shared_or_unwritable_or_unmapped_memory_is_refused() {
        let page = page_size();
        // A shared anonymous mapping (like a shared file mapping, it is not ours to move).
        let shared = map_anon(page, libc::MAP_SHARED).unwrap();
        // SAFETY: the test's own mapping.
        let r = unsafe { adopt(shared, 64, c"x") };
        assert!(matches!(r, Err(ShmError::NotPrivate { .. })), "{r:?}");
        // Read-only.
        let p = anon(2 * page);
        // SAFETY: on the test's own mapping.
        assert_eq!(
            unsafe { libc::mprotect(p.cast(), page, libc::PROT_READ) },
            0
        );
        // SAFETY: as above.
        let r = unsafe { adopt(p, 10, c"x") };
        assert!(matches!(r, Err(ShmError::NotPrivate { .. })), "{r:?}");
        // A hole: the second page unmapped, the buffer spanning both.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::munmap(p.add(page).cast(), page) }, 0);
        // SAFETY: as above; the range is refused before anything is read.
        let r = unsafe { adopt(p.add(page - 8), 16, c"x") };
        assert!(matches!(r, Err(ShmError::NotPrivate { .. })), "{r:?}");
        // SAFETY: as above.
        let r = unsafe { adopt(p, 0, c"x") };
        assert!(matches!(r, Err(ShmError::BadSize(0))), "{r:?}");
    }
}
