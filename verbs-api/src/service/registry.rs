//! The pages this process has moved onto shared memory for registrations through a service,
//! so that two registrations may share pages. Pages move once, in pieces (one memfd each,
//! one `shm::adopt`): a registration reuses the pieces that already hold some of its pages
//! and moves only the rest, and is then the list of pieces it spans, which the service maps
//! one after another. A piece goes back to private memory when the last registration using
//! it goes.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ferroce_drivers::shm::{self, Adopted, ShmError, MAX_PIECES};

/// A piece: the pages one `adopt` moved, and how many registrations use it.
struct Held {
    adopted: Adopted,
    users: usize,
}

/// Pieces by first page.
static PIECES: Mutex<BTreeMap<usize, Held>> = Mutex::new(BTreeMap::new());

fn pieces() -> MutexGuard<'static, BTreeMap<usize, Held>> {
    PIECES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held to write while pages move (`shm::adopt`, `shm::release`), and to read by this
/// library's own threads (the service client's watcher, rdma_cm's dispatchers) while they
/// work: a page that moves is copied and then mapped over, and a store into it in between
/// is lost. A heap buffer's first and last pages hold malloc's own records and other
/// allocations, which those threads' allocations and frees write; ucmatose through a service
/// corrupted its heap that way in about 1 run in 25. A program's own threads are the
/// program's business, as for any `ibv_reg_mr`.
static QUIET: RwLock<()> = RwLock::new(());

thread_local! {
    /// This thread holds [`QUIET`] to read (a move on it must not wait for itself).
    static READING: Cell<u32> = const { Cell::new(0) };
}

/// Keeps registrations through a service from moving pages while the caller's thread
/// touches the heap (see [`QUIET`]): for a library thread the program does not know of.
pub struct Quiet(#[allow(dead_code)] RwLockReadGuard<'static, ()>);

impl Drop for Quiet {
    fn drop(&mut self) {
        READING.with(|n| n.set(n.get() - 1));
    }
}

/// See [`Quiet`].
pub fn quiet() -> Quiet {
    let guard = QUIET.read().unwrap_or_else(PoisonError::into_inner);
    READING.with(|n| n.set(n.get() + 1));
    Quiet(guard)
}

/// Held around a move: `None` on a thread that holds [`quiet`] itself (it cannot wait for
/// its own guard; the move then goes ahead as it did before there was one).
fn moving() -> Option<RwLockWriteGuard<'static, ()>> {
    if READING.with(Cell::get) > 0 {
        return None;
    }
    Some(QUIET.write().unwrap_or_else(PoisonError::into_inner))
}

fn page() -> usize {
    rustix::param::page_size()
}

/// A registration's pages: the pieces it uses (by first page), and where in each.
#[derive(Debug)]
pub(crate) struct Pages {
    /// (piece's first page, offset in its memfd, bytes), in address order.
    spans: Vec<(usize, u64, u64)>,
    /// Where the registration's first byte is in the pieces laid end to end.
    pub(crate) offset: u64,
}

/// Why pages could not be shared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PagesError {
    /// Moving the pages failed.
    #[error("{0}")]
    Shm(#[from] ShmError),
    /// More pieces than one registration may span.
    #[error("the buffer spans more than {MAX_PIECES} pieces of memory registered before it")]
    TooManyPieces,
}

impl Pages {
    /// The pages of `[addr, addr + len)`, moved where they are not yet.
    ///
    /// # Safety
    /// As [`shm::adopt`] for the pages not moved yet: no other thread touches them during
    /// the call.
    pub(crate) unsafe fn share(addr: usize, len: usize) -> Result<Self, PagesError> {
        let pg = page();
        let start = addr / pg * pg;
        let end = (addr + len.max(1)).div_ceil(pg) * pg;
        let mut held = pieces();
        // The pieces that hold some of [start, end), and the gaps between them.
        let mut parts: Vec<(usize, usize, Option<usize>)> = Vec::new(); // (from, to, piece)
        let mut at = start;
        let overlapping: Vec<(usize, usize)> = held
            .range(..end)
            .filter(|(_, h)| h.adopted.start() + h.adopted.len() > start)
            .map(|(&k, h)| (k, k + h.adopted.len()))
            .collect();
        for (k, kend) in overlapping {
            if k > at {
                parts.push((at, k, None));
            }
            let from = at.max(k);
            let to = kend.min(end);
            parts.push((from, to, Some(k)));
            at = to;
        }
        if at < end {
            parts.push((at, end, None));
        }
        if parts.len() > MAX_PIECES {
            return Err(PagesError::TooManyPieces);
        }
        let mut spans = Vec::with_capacity(parts.len());
        let mut moved = Vec::new();
        for (from, to, piece) in parts {
            let key = match piece {
                Some(k) => k,
                None => {
                    let still = moving();
                    // SAFETY: the caller's promise, for these pages (not moved before); this
                    // library's own threads are held off by `still`.
                    let adopted = unsafe { shm::adopt(from as *mut u8, to - from, c"ferroce-mr") };
                    drop(still);
                    match adopted {
                        Ok(a) => {
                            held.insert(
                                from,
                                Held {
                                    adopted: a,
                                    users: 0,
                                },
                            );
                            moved.push(from);
                            from
                        }
                        Err(e) => {
                            // Put back what this call moved.
                            for k in moved {
                                if let Some(h) = held.remove(&k) {
                                    let _still = moving();
                                    // SAFETY: pages this call moved, under its caller's promise.
                                    let _ = unsafe { shm::release(h.adopted) };
                                }
                            }
                            return Err(e.into());
                        }
                    }
                }
            };
            let piece_start = held[&key].adopted.start();
            spans.push((key, (from - piece_start) as u64, (to - from) as u64));
        }
        for (k, _, _) in &spans {
            if let Some(h) = held.get_mut(k) {
                h.users += 1;
            }
        }
        Ok(Self {
            spans,
            offset: (addr - start) as u64,
        })
    }

    /// Each piece's memfd, offset and length, in order, for the request.
    pub(crate) fn with_pieces<T>(&self, f: impl FnOnce(&[(BorrowedFd<'_>, u64, u64)]) -> T) -> T {
        let held = pieces();
        let list: Vec<_> = self
            .spans
            .iter()
            .filter_map(|(k, off, len)| Some((held.get(k)?.adopted.fd().as_fd(), *off, *len)))
            .collect();
        f(&list)
    }

    /// The registration goes: each piece it used that no other registration uses goes back
    /// to private memory.
    ///
    /// # Safety
    /// As [`shm::release`]: no other thread touches the pages that move back.
    pub(crate) unsafe fn unshare(self) {
        let mut held = pieces();
        for (k, _, _) in self.spans {
            let last = held.get_mut(&k).is_some_and(|h| {
                h.users -= 1;
                h.users == 0
            });
            if last {
                if let Some(h) = held.remove(&k) {
                    let _still = moving();
                    // SAFETY: the caller's promise; this library's threads are held off.
                    let _ = unsafe { shm::release(h.adopted) };
                }
            }
        }
    }
}
