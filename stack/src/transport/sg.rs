//! Gather and scatter over a work request's element list, through the checked accessor.

use smallvec::SmallVec;

use super::mr::{Access, AccessError, MemSpan, MrTable, PdId};
use super::wr::Sge;

/// Why a scatter/gather failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SgError {
    /// The data does not fit the elements' total length.
    Length,
    /// An element failed its key, PD, rights or bounds check.
    Access(AccessError),
}

/// Total bytes the list covers.
pub(crate) fn total_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Checks every element for `needed` rights without moving data.
pub(crate) fn check(
    mem: &MrTable,
    pd: PdId,
    sges: &[Sge],
    needed: Access,
) -> Result<(), AccessError> {
    for s in sges {
        mem.check_access(s.lkey, pd, s.addr, u64::from(s.length), needed)?;
    }
    Ok(())
}

/// Walks the pieces of `sges` covering `len` bytes from message offset `offset`, calling
/// `f(sge, address, piece_offset, piece_len)` for each, in order.
fn walk(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), SgError>,
) -> Result<(), SgError> {
    let mut done = 0usize;
    for s in sges {
        if done == len {
            break;
        }
        let sl = u64::from(s.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let piece = ((sl - offset) as usize).min(len - done);
        f(s, s.addr + offset, done, piece)?;
        done += piece;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(SgError::Length)
    }
}

/// Copies `out.len()` bytes starting at message offset `offset` out of the elements.
pub(crate) fn gather(
    mem: &MrTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    out: &mut [u8],
) -> Result<(), SgError> {
    if let [s] = sges {
        // The common case: one element, one checked copy.
        if offset + out.len() as u64 > u64::from(s.length) {
            return Err(SgError::Length);
        }
        return mem
            .read(s.lkey, pd, s.addr + offset, out, Access::NONE)
            .map_err(SgError::Access);
    }
    let len = out.len();
    walk(sges, offset, len, |s, va, at, n| {
        mem.read(s.lkey, pd, va, &mut out[at..at + n], Access::NONE)
            .map_err(SgError::Access)
    })
}

/// The pieces of registered memory holding `len` bytes from message offset `offset`, lent in
/// place (a zero-copy transmit's payload).
pub(crate) fn spans<'m>(
    mem: &'m MrTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    len: usize,
) -> Result<SmallVec<[MemSpan<'m>; 2]>, SgError> {
    let mut out = SmallVec::new();
    walk(sges, offset, len, |s, va, _, n| {
        out.push(
            mem.span(s.lkey, pd, va, n, Access::NONE)
                .map_err(SgError::Access)?,
        );
        Ok(())
    })?;
    Ok(out)
}

/// Copies `data` into the elements at message offset `offset` (needs LOCAL_WRITE).
pub(crate) fn scatter(
    mem: &MrTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), SgError> {
    if let [s] = sges {
        if offset + data.len() as u64 > u64::from(s.length) {
            return Err(SgError::Length);
        }
        return mem
            .write(s.lkey, pd, s.addr + offset, data, Access::LOCAL_WRITE)
            .map_err(SgError::Access);
    }
    walk(sges, offset, data.len(), |s, va, at, n| {
        mem.write(s.lkey, pd, va, &data[at..at + n], Access::LOCAL_WRITE)
            .map_err(SgError::Access)
    })
}

/// Copies `data` into a receive's elements from its start, through the checked accessor
/// (needs LOCAL_WRITE): for a queue beside the transport's, such as a raw packet QP.
pub fn scatter_from_start(
    mem: &MrTable,
    pd: PdId,
    sges: &[Sge],
    data: &[u8],
) -> Result<(), SgError> {
    scatter(mem, pd, sges, 0, data)
}
