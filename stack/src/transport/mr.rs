//! Registered memory: protection domains, memory regions, keys, and the one accessor through
//! which the transport touches application memory (IBTA Vol 1 §10.6).
//!
//! Every access names a key, a PD, an address range and the rights it needs; the table checks
//! all four before a byte moves, so a request that fails any check writes nothing
//! (invariant 3). Keys are random 32-bit values from a seeded generator: not guessable by a
//! peer that saw other keys, yet the same for the same seed in the simulator. As on mlx5, a
//! region's lkey and rkey are the same number.
//!
//! This module and the drivers are the only places with `unsafe`: registration takes a raw
//! pointer whose validity the caller promises, and every later access is bounds-checked
//! against it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::wire::Span;

/// Access rights of a region, with libibverbs' `IBV_ACCESS_*` bit values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(pub u32);

flag_set!(Access);

impl Access {
    /// No rights beyond local read (which every region has).
    pub const NONE: Self = Self(0);
    /// The local side may write (receive buffers, READ response targets).
    pub const LOCAL_WRITE: Self = Self(1);
    /// Peers may WRITE.
    pub const REMOTE_WRITE: Self = Self(2);
    /// Peers may READ.
    pub const REMOTE_READ: Self = Self(4);
    /// Peers may run atomics.
    pub const REMOTE_ATOMIC: Self = Self(8);
}

/// A protection domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// The keys of a registered region (lkey and rkey are equal, as on mlx5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// Key for local scatter/gather entries.
    pub lkey: u32,
    /// Key peers name in RETH / AtomicETH.
    pub rkey: u32,
}

/// Why an access was refused. Remote requests turn these into a NAK (remote access error);
/// local work requests into a local protection error completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No region has this key (never registered, or deregistered).
    #[error("no memory region has key {0:#010x}")]
    InvalidKey(u32),
    /// The region belongs to another protection domain.
    #[error("key {0:#010x} belongs to another protection domain")]
    PdMismatch(u32),
    /// The region lacks a right the access needs.
    #[error("key {key:#010x} lacks access rights {needed:#x}")]
    Permission {
        /// The key.
        key: u32,
        /// The rights asked for.
        needed: u32,
    },
    /// The range is not inside the region.
    #[error("{len} bytes at {va:#x} are outside the region of key {key:#010x}")]
    Bounds {
        /// The key.
        key: u32,
        /// Start of the access.
        va: u64,
        /// Its length.
        len: u64,
    },
    /// An atomic's address is not 8-byte aligned.
    #[error("atomic address {0:#x} is not 8-byte aligned")]
    Misaligned(u64),
}

/// Why a registration was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Remote write or atomic rights without local write (IBTA C10-? / libibverbs EINVAL).
    #[error("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE")]
    RemoteWriteNeedsLocalWrite,
    /// The region's I/O virtual address range would wrap.
    #[error("a {len}-byte region at iova {iova:#x} wraps the address space")]
    Wraps {
        /// Requested iova.
        iova: u64,
        /// Requested length.
        len: usize,
    },
    /// Every key slot is taken (2^20 - 1 regions).
    #[error("too many memory regions (at most 1048575)")]
    TooMany,
    /// No region of the application's has these keys.
    #[error("no such memory region")]
    NoSuchRegion,
}

struct Region {
    pd: PdId,
    base: *mut u8,
    len: usize,
    iova: u64,
    access: Access,
    /// Memory the table allocated for the region (see `register_owned`), freed with the
    /// region's last copy.
    _owned: Option<Arc<Box<[u64]>>>,
    /// Set when the region is seen by several tables (one per engine of a device, see
    /// [`MrTable::share`]) or was invalidated: cleared by an invalidation in any table, so
    /// a key a SEND_WITH_INVALIDATE revoked on one engine's QP is dead on every engine.
    valid: Option<Arc<AtomicBool>>,
    /// Set for a slotted region ([`MrTable::register_slotted`]): its bytes are other
    /// regions' bytes, or nowhere.
    slotted: Option<Arc<Slotted>>,
    /// Set for a memory window ([`MrTable::alloc_window`]): its bytes are a region's, once
    /// bound.
    window: Option<Window>,
}

/// A memory window's own state (IBTA Vol 1 §10.6.7): its type and, once bound, the region it
/// opens onto and (type 2) the QP it is bound to. While unbound (or invalidated) its
/// validity flag is clear, so every access with its key is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    /// Type 2 (bound by a work request, to one QP, invalidated by key); else type 1.
    type2: bool,
    /// The key of the region it is bound onto.
    parent: Option<u32>,
    /// Type 2: the QP it is bound to, the only one whose requests may use it.
    qp: Option<u32>,
}

/// What binding a memory window asks ([`MrTable::bind_window`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowBind {
    /// The window's key now.
    pub mw_key: u32,
    /// Its key after the bind: the consumer's, differing from the window's in the low eight
    /// bits only (for a type 2 window, checked; for a type 1, only those bits are taken).
    pub new_key: u32,
    /// The region it opens onto (its lkey).
    pub mr_key: u32,
    /// First address of the window, in the region's address space.
    pub addr: u64,
    /// Its length; zero unbinds a type 1 window.
    pub len: u64,
    /// The rights it grants (remote read, write, atomic; local write never).
    pub access: Access,
    /// The QP binding it (type 2: the QP it will be bound to).
    pub qpn: u32,
}

/// Why a memory window operation was refused: what completes the bind or invalidate with
/// `IBV_WC_MW_BIND_ERR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// No window has this key (never allocated, or deallocated).
    #[error("no memory window has key {0:#010x}")]
    NoSuchWindow(u32),
    /// A type 2 window's new key names another window (its upper 24 bits changed).
    #[error("key {new:#010x} is not a key of window {old:#010x}")]
    KeyMismatch {
        /// The window's key.
        old: u32,
        /// The key asked for.
        new: u32,
    },
    /// A type 2 window that is bound already (invalidate it first).
    #[error("window {0:#010x} is bound")]
    Bound(u32),
    /// The operation is for the other type of window (a type 1 window cannot be bound by a
    /// work request or invalidated; a type 2 cannot be bound by `ibv_bind_mw`).
    #[error("window {0:#010x} is not of the right type for this operation")]
    WrongType(u32),
    /// The region: missing, of another PD, without `IBV_ACCESS_MW_BIND`, too small, or
    /// without local write while the window grants remote write or atomics.
    #[error("region {key:#010x} cannot take this window: {why}")]
    Region {
        /// The region's key.
        key: u32,
        /// Why.
        why: &'static str,
    },
    /// The window and the QP binding it are in different protection domains.
    #[error("window {0:#010x} belongs to another protection domain")]
    PdMismatch(u32),
}

/// `IBV_ACCESS_MW_BIND`: a region windows may be bound onto.
pub const ACCESS_MW_BIND: Access = Access(0x10);

/// Where one share of a slotted region goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlotTarget {
    /// Writes vanish (counted), reads and atomics are refused: the null MR a late packet of
    /// a completed message lands in.
    #[default]
    Discard,
    /// The share's first `len` bytes are `len` bytes at `va` of the (plain) region `key`,
    /// accessed with that region's PD and its LOCAL_WRITE right, as an RNIC's indirect key
    /// reaches the regions it lists with their own rights.
    Mapped {
        /// The target region's lkey.
        key: u32,
        /// Where in it the share starts.
        va: u64,
        /// How much of the share is mapped; the rest of the share is out of bounds.
        len: u64,
    },
}

/// The mapping of a slotted region, shared by every table that holds the region and by its
/// owner, who re-points shares while the engines write through them (a post maps a slot onto
/// the receive's buffer, a completion back onto [`SlotTarget::Discard`]).
///
/// Each share's target is a sequence lock over three atomics: a packet's lookup is a few
/// loads and no lock (it runs for every packet), a re-pointing takes the writers' mutex and
/// bumps the sequence around its stores, and a lookup that raced one reads again.
#[derive(Debug)]
pub struct Slotted {
    share: u64,
    targets: Vec<SlotCell>,
    writers: std::sync::Mutex<()>,
    discarded: AtomicU64,
}

/// One share's target: `key` is `u64::MAX` for the discard target.
#[derive(Debug, Default)]
struct SlotCell {
    seq: AtomicU64,
    key: AtomicU64,
    va: AtomicU64,
    len: AtomicU64,
}

const DISCARD: u64 = u64::MAX;

impl Slotted {
    fn new(share: u64, slots: u32) -> Self {
        Self {
            share,
            targets: (0..slots)
                .map(|_| SlotCell {
                    key: AtomicU64::new(DISCARD),
                    ..SlotCell::default()
                })
                .collect(),
            writers: std::sync::Mutex::new(()),
            discarded: AtomicU64::new(0),
        }
    }

    /// Bytes per share.
    pub fn share(&self) -> u64 {
        self.share
    }

    /// Shares in the region.
    pub fn slots(&self) -> u32 {
        self.targets.len() as u32
    }

    /// Points share `slot` at `target`. False when there is no such slot or the target is
    /// longer than a share. Whether the target region exists, and may be written, is
    /// checked at each access, so a target deregistered later is refused then.
    pub fn map(&self, slot: u32, target: SlotTarget) -> bool {
        let (key, va, len) = match target {
            SlotTarget::Discard => (DISCARD, 0, 0),
            SlotTarget::Mapped { len, .. } if len > self.share => return false,
            SlotTarget::Mapped { key, va, len } => (u64::from(key), va, len),
        };
        let Some(c) = self.targets.get(slot as usize) else {
            return false;
        };
        let _w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        // Odd while the fields change; a reader that sees odd, or a change, reads again.
        c.seq.fetch_add(1, Ordering::AcqRel);
        c.key.store(key, Ordering::Release);
        c.va.store(va, Ordering::Release);
        c.len.store(len, Ordering::Release);
        c.seq.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Where share `slot` goes now.
    pub fn target(&self, slot: u32) -> Option<SlotTarget> {
        let c = self.targets.get(slot as usize)?;
        loop {
            let before = c.seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                core::hint::spin_loop();
                continue;
            }
            let (key, va, len) = (
                c.key.load(Ordering::Acquire),
                c.va.load(Ordering::Acquire),
                c.len.load(Ordering::Acquire),
            );
            if c.seq.load(Ordering::Acquire) == before {
                return Some(if key == DISCARD {
                    SlotTarget::Discard
                } else {
                    SlotTarget::Mapped {
                        key: key as u32,
                        va,
                        len,
                    }
                });
            }
        }
    }

    /// Bytes written into discarded shares so far.
    pub fn discarded_bytes(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }
}

/// A registered region as another table adopts it ([`MrTable::share`], [`MrTable::adopt`]):
/// the same keys, memory, bounds and rights, and one validity flag for all copies.
#[derive(Debug)]
pub struct RegionShare {
    keys: MrKeys,
    pd: PdId,
    base: *mut u8,
    len: usize,
    iova: u64,
    access: Access,
    owned: Option<Arc<Box<[u64]>>>,
    valid: Arc<AtomicBool>,
    slotted: Option<Arc<Slotted>>,
    window: Option<Window>,
}

impl RegionShare {
    /// The keys the region has in every table.
    pub fn keys(&self) -> MrKeys {
        self.keys
    }
}

// SAFETY: a Region is a pointer plus bounds. The registrant promised (see
// `MrTable::register`) that the memory stays valid until deregistration; moving that promise
// to another thread does not change it. Concurrent access by the application is its own
// business, as with any RDMA NIC; the table only ever reads/writes within bounds.
unsafe impl Send for Region {}

/// A checked range of registered memory, lent in place by [`MrTable::span`].
#[derive(Clone, Copy, Debug)]
pub struct MemSpan<'a> {
    ptr: *mut u8,
    len: usize,
    _table: core::marker::PhantomData<&'a MrTable>,
}

impl Span for MemSpan<'_> {
    /// The address stays valid while the region is registered; a NIC that reads it after
    /// the transmit call returns (an external mbuf) relies on the application keeping the
    /// memory until the work request completes, as with any RNIC.
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn copy_to(&self, out: &mut [u8]) {
        assert_eq!(
            out.len(),
            self.len,
            "MemSpan::copy_to needs a buffer of the span's length"
        );
        if self.len > 0 {
            // SAFETY: `MrTable::span` checked the range inside a registered region, which
            // stays valid while the borrow of the table this span carries lives.
            unsafe { copy_bytes(self.ptr, out.as_mut_ptr(), self.len) };
        }
    }
}

impl MemSpan<'_> {
    /// Feeds the span to an ICRC.
    pub fn icrc_update(&self, crc: &mut crate::wire::icrc::IcrcState) {
        if self.len > 0 {
            // SAFETY: as in `copy_to`. The application may write the region concurrently (as
            // it may under any RNIC's DMA); the bytes hashed are then what it wrote, and
            // nothing here relies on them staying put.
            crc.update(unsafe { core::slice::from_raw_parts(self.ptr, self.len) });
        }
    }
}

/// Bits of a key that name its slot (plus one, so no key is zero), from bit 8 on; the low
/// eight bits and the top four are a random tag. The low eight are the "key" portion IBTA
/// leaves to the consumer (§10.6.7.2.2): a type 2 memory window is bound under a new rkey
/// that differs from the old in those bits only, and the slot stays the same.
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
const INDEX_SHIFT: u32 = 8;

/// The slot number (plus one) a key names.
const fn slot_of(key: u32) -> u32 {
    (key >> INDEX_SHIFT) & INDEX_MASK
}

/// Regions by key. A key is `(slot + 1) << 8` under a random tag, as an RNIC's memory keys are
/// an index and a variant: a lookup is an index and one compare, not a hash (a 64-byte
/// WRITE looks keys up three or four times). Up to 2^20 - 1 regions; a freed slot is reused
/// last (first in, first out) and with a fresh 12-bit tag, so a stale key names a new
/// region only if its slot came round again with the same tag.
#[derive(Default)]
struct Slab {
    slots: Vec<Option<(u32, Region)>>,
    free: std::collections::VecDeque<u32>,
    len: usize,
}

impl Slab {
    fn index(key: u32) -> Option<usize> {
        slot_of(key).checked_sub(1).map(|i| i as usize)
    }

    #[inline]
    fn get(&self, key: u32) -> Option<&Region> {
        match self.slots.get(Self::index(key)?) {
            Some(Some((k, r))) if *k == key => Some(r),
            _ => None,
        }
    }

    fn get_mut(&mut self, key: u32) -> Option<&mut Region> {
        match self.slots.get_mut(Self::index(key)?) {
            Some(Some((k, r))) if *k == key => Some(r),
            _ => None,
        }
    }

    fn contains(&self, key: u32) -> bool {
        self.get(key).is_some()
    }

    /// A free slot for a new key, or `None` when all 2^20 - 1 are taken.
    fn free_slot(&mut self) -> Option<u32> {
        if let Some(i) = self.free.pop_front() {
            return Some(i);
        }
        let i = self.slots.len() as u32;
        (i < INDEX_MASK).then(|| {
            self.slots.push(None);
            i
        })
    }

    /// Puts `region` under `key`, whose slot must be free (grown to if past the end).
    fn insert(&mut self, key: u32, region: Region) -> bool {
        let Some(i) = Self::index(key) else {
            return false;
        };
        if i >= self.slots.len() {
            for j in self.slots.len()..i {
                self.free.push_back(j as u32);
            }
            self.slots.resize_with(i + 1, || None);
        } else if self.slots[i].is_some() {
            return false;
        } else {
            self.free.retain(|&j| j as usize != i);
        }
        self.slots[i] = Some((key, region));
        self.len += 1;
        true
    }

    fn remove(&mut self, key: u32) -> Option<Region> {
        let i = Self::index(key)?;
        match self.slots.get(i) {
            Some(Some((k, _))) if *k == key => {}
            _ => return None,
        }
        let (_, r) = self.slots[i].take()?;
        self.free.push_back(i as u32);
        self.len -= 1;
        Some(r)
    }
}

/// The registered regions of one device.
pub struct MrTable {
    regions: Slab,
    key_state: u64,
    /// A memory window was ever entered: until then no key is a window's, and a responder's
    /// check that a type 2 window is its QP's ([`window_allows`](Self::window_allows)) costs
    /// no lookup.
    has_windows: bool,
}

impl MrTable {
    /// An empty table whose keys derive from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            regions: Slab::default(),
            key_state: seed,
            has_windows: false,
        }
    }

    /// A key for a new region: a free slot and a random tag (SplitMix64 from the table's
    /// seed, so tables with different seeds hand out different keys).
    fn next_key(&mut self) -> Option<u32> {
        let slot = self.regions.free_slot()?;
        self.key_state = self.key_state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.key_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let tag = (z ^ (z >> 31)) as u32;
        Some((tag & 0xf000_00ff) | (slot + 1) << INDEX_SHIFT)
    }

    /// Registers `len` bytes at `base`, which peers address as `iova .. iova + len`.
    ///
    /// # Safety
    /// `base .. base + len` must be valid for reads and writes, and stay so until
    /// [`deregister`](Self::deregister) returns for these keys (or the table is dropped) here
    /// and in every table that [adopted](Self::adopt) the region.
    pub unsafe fn register(
        &mut self,
        pd: PdId,
        base: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegisterError> {
        let remote_writes = Access::REMOTE_WRITE.with(Access::REMOTE_ATOMIC);
        if access.0 & remote_writes.0 != 0 && !access.contains(Access::LOCAL_WRITE) {
            return Err(RegisterError::RemoteWriteNeedsLocalWrite);
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(RegisterError::Wraps { iova, len });
        }
        let key = self.next_key().ok_or(RegisterError::TooMany)?;
        self.regions.insert(
            key,
            Region {
                pd,
                base,
                len,
                iova,
                access,
                _owned: None,
                valid: None,
                slotted: None,
                window: None,
            },
        );
        Ok(MrKeys {
            lkey: key,
            rkey: key,
        })
    }

    /// Allocates `len` zeroed bytes (8-byte aligned, so atomics work anywhere aligned in
    /// them) and registers them; the memory lives exactly as long as the registration.
    /// Returns the keys and the region's address, which is also its iova. The safe way to get
    /// registered memory: the application reads and writes it through [`read`](Self::read)
    /// and [`write`](Self::write).
    pub fn register_owned(
        &mut self,
        pd: PdId,
        len: usize,
        access: Access,
    ) -> Result<(MrKeys, u64), RegisterError> {
        self.register_owned_inner(pd, len, None, access)
    }

    /// [`register_owned`](Self::register_owned) with peers addressing the region as
    /// `iova .. iova + len` (0 makes addresses offsets, as tests like them).
    pub fn register_owned_at(
        &mut self,
        pd: PdId,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegisterError> {
        self.register_owned_inner(pd, len, Some(iova), access)
            .map(|(keys, _)| keys)
    }

    fn register_owned_inner(
        &mut self,
        pd: PdId,
        len: usize,
        iova: Option<u64>,
        access: Access,
    ) -> Result<(MrKeys, u64), RegisterError> {
        let mut buf = vec![0u64; len.div_ceil(8).max(1)].into_boxed_slice();
        let base = buf.as_mut_ptr().cast::<u8>();
        let iova = iova.unwrap_or(base as u64);
        // SAFETY: the allocation moves into the region below and is freed only when the
        // region is removed from the table, so it outlives every access through these keys.
        let keys = unsafe { self.register(pd, base, len, iova, access) }?;
        if let Some(r) = self.regions.get_mut(keys.lkey) {
            r._owned = Some(Arc::new(buf));
        }
        Ok((keys, iova))
    }

    /// Registers `len` bytes at `offset` inside the owned region `of` again, under new keys,
    /// in `pd` with `access`, addressed as `iova .. iova + len`: a second view of the same
    /// memory (a region to invalidate, or one with fewer rights). It keeps the memory alive
    /// on its own. `None` when `of` is not an owned region or the range leaves it.
    pub fn register_within(
        &mut self,
        of: MrKeys,
        offset: usize,
        len: usize,
        (pd, iova, access): (PdId, u64, Access),
    ) -> Option<Result<MrKeys, RegisterError>> {
        let r = self.regions.get(of.lkey)?;
        let owned = r._owned.clone()?;
        if offset.checked_add(len)? > r.len {
            return None;
        }
        // SAFETY: offset + len <= the region's length, so the range is inside the owned
        // allocation, which the new region keeps alive through its own `Arc`.
        let keys = unsafe { self.register(pd, r.base.add(offset), len, iova, access) };
        Some(keys.inspect(|k| {
            if let Some(r) = self.regions.get_mut(k.lkey) {
                r._owned = Some(owned);
            }
        }))
    }

    /// Registers a zero-based region of `slots` shares of `share` bytes each (iova
    /// `0 .. slots·share`), every share initially [`SlotTarget::Discard`]; the returned
    /// [`Slotted`] re-points them. SDR's per-QP receive region (issue 21): message `n`'s
    /// packets name `slot(n)·share + offset` under one rkey, whatever buffer the receive was
    /// posted with, and a completed message's late packets fall into the discard target —
    /// an RNIC does this with an indirect key whose entries it rewrites per message. Only
    /// `write` resolves into a discarded share; reads, spans and atomics there are refused.
    pub fn register_slotted(
        &mut self,
        pd: PdId,
        slots: u32,
        share: u64,
        access: Access,
    ) -> Result<(MrKeys, Arc<Slotted>), RegisterError> {
        let len = u64::from(slots)
            .checked_mul(share)
            .filter(|&l| usize::try_from(l).is_ok())
            .ok_or(RegisterError::Wraps {
                iova: 0,
                len: usize::MAX,
            })?;
        let key = self.next_key().ok_or(RegisterError::TooMany)?;
        let slotted = Arc::new(Slotted::new(share, slots));
        self.regions.insert(
            key,
            Region {
                pd,
                base: core::ptr::null_mut(),
                len: len as usize,
                iova: 0,
                access,
                _owned: None,
                valid: None,
                slotted: Some(slotted.clone()),
                window: None,
            },
        );
        Ok((
            MrKeys {
                lkey: key,
                rkey: key,
            },
            slotted,
        ))
    }

    /// `ibv_rereg_mr` in place: the region keeps its keys and takes a new protection domain,
    /// new memory (`base`, `len`, addressed as `iova`), and/or new rights, whichever are
    /// given. Accesses after it see the new registration only.
    ///
    /// # Safety
    /// New memory is under [`register`](Self::register)'s promise from now on.
    pub unsafe fn reregister(
        &mut self,
        keys: MrKeys,
        pd: Option<PdId>,
        memory: Option<(*mut u8, usize, u64)>,
        access: Option<Access>,
    ) -> Result<(), RegisterError> {
        let r = self
            .regions
            .get_mut(keys.lkey)
            .ok_or(RegisterError::NoSuchRegion)?;
        if r.slotted.is_some() || (memory.is_some() && r._owned.is_some()) {
            return Err(RegisterError::NoSuchRegion);
        }
        let new_access = access.unwrap_or(r.access);
        let remote_writes = Access::REMOTE_WRITE.with(Access::REMOTE_ATOMIC);
        if new_access.0 & remote_writes.0 != 0 && !new_access.contains(Access::LOCAL_WRITE) {
            return Err(RegisterError::RemoteWriteNeedsLocalWrite);
        }
        if let Some((_, len, iova)) = memory {
            if iova.checked_add(len as u64).is_none() {
                return Err(RegisterError::Wraps { iova, len });
            }
        }
        r.access = new_access;
        if let Some(pd) = pd {
            r.pd = pd;
        }
        if let Some((base, len, iova)) = memory {
            r.base = base;
            r.len = len;
            r.iova = iova;
        }
        Ok(())
    }

    /// Forgets a region: every later access with its keys fails with `InvalidKey`.
    /// Returns false if the keys were not registered.
    pub fn deregister(&mut self, keys: MrKeys) -> bool {
        self.regions.remove(keys.lkey).is_some()
    }

    /// Where the region of `key` lies in memory and how long it is (for a port that must
    /// map registered memory before sending from it).
    pub fn extent(&self, key: u32) -> Option<(usize, usize)> {
        self.regions
            .get(key)
            .filter(|r| r.slotted.is_none() && r.window.is_none())
            .map(|r| (r.base as usize, r.len))
    }

    /// Describes the region of `keys` for [`adopt`](Self::adopt) by another table, so that
    /// several engines of one device see the same registration (each looks keys up in its
    /// own table, without a lock). From now on an invalidation through any copy revokes
    /// all of them. `None` when the keys are not registered here.
    pub fn share(&mut self, keys: MrKeys) -> Option<RegionShare> {
        let r = self.regions.get_mut(keys.lkey)?;
        let valid = r
            .valid
            .get_or_insert_with(|| Arc::new(AtomicBool::new(true)))
            .clone();
        Some(RegionShare {
            keys,
            pd: r.pd,
            base: r.base,
            len: r.len,
            iova: r.iova,
            access: r.access,
            owned: r._owned.clone(),
            valid,
            slotted: r.slotted.clone(),
            window: r.window,
        })
    }

    /// Enters a region another table registered, under the same keys. Returns false (and
    /// changes nothing) if this table already has a region with that key. Memory the table
    /// allocated ([`register_owned`](Self::register_owned)) lives until its last copy goes;
    /// memory the application registered is covered by [`register`](Self::register)'s
    /// promise, which extends to every table that adopts the region.
    pub fn adopt(&mut self, share: &RegionShare) -> bool {
        if self.regions.contains(share.keys.lkey) {
            return false;
        }
        self.has_windows |= share.window.is_some();
        self.regions.insert(
            share.keys.lkey,
            Region {
                pd: share.pd,
                base: share.base,
                len: share.len,
                iova: share.iova,
                access: share.access,
                _owned: share.owned.clone(),
                valid: Some(share.valid.clone()),
                slotted: share.slotted.clone(),
                window: share.window,
            },
        )
    }

    /// True when region `key` is registered and not invalidated.
    fn live(&self, key: u32) -> bool {
        self.regions
            .get(key)
            .is_some_and(|r| r.valid.as_ref().is_none_or(|v| v.load(Ordering::Acquire)))
    }

    /// `ibv_alloc_mw`: a memory window of `pd`, type 2 (bound by work requests to one QP) or
    /// type 1, unbound (every access with its key is refused until it is bound). Returns its
    /// key.
    pub fn alloc_window(&mut self, pd: PdId, type2: bool) -> Result<u32, RegisterError> {
        let key = self.next_key().ok_or(RegisterError::TooMany)?;
        self.has_windows = true;
        self.regions.insert(
            key,
            Region {
                pd,
                base: core::ptr::null_mut(),
                len: 0,
                iova: 0,
                access: Access::NONE,
                _owned: None,
                valid: Some(Arc::new(AtomicBool::new(false))),
                slotted: None,
                window: Some(Window {
                    type2,
                    parent: None,
                    qp: None,
                }),
            },
        );
        Ok(key)
    }

    /// `ibv_dealloc_mw`: every later access with the window's key fails with `InvalidKey`.
    /// False when `key` is no window.
    pub fn dealloc_window(&mut self, key: u32) -> bool {
        // The window may have been rebound under another key of its slot since.
        let Some(i) = Slab::index(key) else {
            return false;
        };
        let now = match self.regions.slots.get(i) {
            Some(Some((k, r))) if r.window.is_some() && k & !0xff == key & !0xff => *k,
            _ => return false,
        };
        self.regions.remove(now).is_some()
    }

    /// Binds a window of `pd` (the binding QP's) onto `len` bytes at `addr` of a region,
    /// with `access` (IBTA Vol 1 §10.6.7.2): the region must be of the same PD, allow
    /// windows (`IBV_ACCESS_MW_BIND`), contain the range, and have local write if the window
    /// grants remote write or atomics. A type 2 window takes the consumer's new key (the
    /// same window, new low eight bits) and is bound to the QP; a type 1 window takes the
    /// low eight bits of the new key, and a zero length unbinds it. Returns the window's new key, under which
    /// (only) it is reached from now on.
    pub fn bind_window(&mut self, pd: PdId, b: WindowBind) -> Result<u32, WindowError> {
        // The window by its slot: a type 2 window's consumer knows the key it allocated,
        // while its binds moved the low eight bits since.
        let i = Slab::index(b.mw_key).ok_or(WindowError::NoSuchWindow(b.mw_key))?;
        let (current, win, mw_pd) = match self.regions.slots.get(i) {
            Some(Some((k, r))) if k & !0xff == b.mw_key & !0xff => match r.window {
                Some(w) => (*k, w, r.pd),
                None => return Err(WindowError::NoSuchWindow(b.mw_key)),
            },
            _ => return Err(WindowError::NoSuchWindow(b.mw_key)),
        };
        if mw_pd != pd {
            return Err(WindowError::PdMismatch(b.mw_key));
        }
        let new_key = if win.type2 {
            if b.new_key & !0xff != b.mw_key & !0xff {
                return Err(WindowError::KeyMismatch {
                    old: b.mw_key,
                    new: b.new_key,
                });
            }
            if self.live(current) {
                return Err(WindowError::Bound(current));
            }
            b.new_key
        } else {
            (current & !0xff) | (b.new_key & 0xff)
        };
        let region = |why| WindowError::Region { key: b.mr_key, why };
        let unbind = !win.type2 && b.len == 0;
        let (base, owned) = if unbind {
            (core::ptr::null_mut(), None)
        } else {
            let r = self
                .regions
                .get(b.mr_key)
                .filter(|r| r.window.is_none() && r.slotted.is_none())
                .ok_or(region("no such region"))?;
            if !self.live(b.mr_key) {
                return Err(region("it was invalidated"));
            }
            if r.pd != pd {
                return Err(region("another protection domain"));
            }
            if !r.access.contains(ACCESS_MW_BIND) {
                return Err(region("registered without IBV_ACCESS_MW_BIND"));
            }
            let remote_writes = Access::REMOTE_WRITE.with(Access::REMOTE_ATOMIC);
            if b.access.0 & remote_writes.0 != 0 && !r.access.contains(Access::LOCAL_WRITE) {
                return Err(region("no local write under a window with remote write"));
            }
            let offset = b
                .addr
                .checked_sub(r.iova)
                .ok_or(region("range outside it"))?;
            if offset
                .checked_add(b.len)
                .is_none_or(|end| end > r.len as u64)
            {
                return Err(region("range outside it"));
            }
            // SAFETY: the range is inside the region (checked just above).
            (unsafe { r.base.add(offset as usize) }, r._owned.clone())
        };
        let Some(Some((k, r))) = self.regions.slots.get_mut(i) else {
            return Err(WindowError::NoSuchWindow(b.mw_key));
        };
        *k = new_key;
        r.base = base;
        r.len = if unbind { 0 } else { b.len as usize };
        r.iova = b.addr;
        r.access = Access(b.access.0 & !Access::LOCAL_WRITE.0);
        r._owned = owned;
        // A fresh flag: the old key's copies (other tables) stay dead.
        r.valid = Some(Arc::new(AtomicBool::new(!unbind)));
        r.window = Some(Window {
            type2: win.type2,
            parent: (!unbind).then_some(b.mr_key),
            qp: win.type2.then_some(b.qpn),
        });
        Ok(new_key)
    }

    /// True when a request on QP `qpn` may use `key`: any key but a type 2 window's, which
    /// only the QP it is bound to may use (IBTA type 2B).
    pub fn window_allows(&self, key: u32, qpn: u32) -> bool {
        if !self.has_windows {
            return true;
        }
        match self.regions.get(key).and_then(|r| r.window) {
            Some(Window {
                type2: true, qp, ..
            }) => qp == Some(qpn),
            _ => true,
        }
    }

    /// Checks that `len` bytes at `va` may be accessed with `needed` rights under `key` and
    /// `pd`, without moving data (the responder checks a whole WRITE at its first packet).
    pub fn check_access(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<(), AccessError> {
        self.check(key, pd, va, len, needed).map(|_| ())
    }

    /// Invalidates `key` on behalf of a SEND_WITH_INVALIDATE that arrived on a QP of `pd`:
    /// later accesses through it, here or in any table that adopted the region, fail with
    /// `InvalidKey`.
    pub fn invalidate(&mut self, key: u32, pd: PdId) -> Result<(), AccessError> {
        let r = self
            .regions
            .get_mut(key)
            .ok_or(AccessError::InvalidKey(key))?;
        if r.pd != pd {
            return Err(AccessError::PdMismatch(key));
        }
        // Only a type 2 window is invalidated by key (a type 1 is unbound by a bind of
        // length zero).
        if r.window.is_some_and(|w| !w.type2) {
            return Err(AccessError::InvalidKey(key));
        }
        // The region stays in the table, dead, until the registrant deregisters it: other
        // tables may hold copies (one of them may own the memory), and a port may have
        // mapped it, which deregistration undoes.
        let valid = r
            .valid
            .get_or_insert_with(|| Arc::new(AtomicBool::new(true)));
        if !valid.swap(false, Ordering::AcqRel) {
            return Err(AccessError::InvalidKey(key));
        }
        Ok(())
    }

    /// Checks an access and returns where `va` is in memory (null for a zero-length access,
    /// which is allowed with any key, as IBTA allows zero-length RDMA: probes use them), or
    /// `None` for a range in a discarded share of a slotted region.
    ///
    /// Inlined into each access for a plain region, the case of every data packet: called,
    /// the saving and restoring of registers cost about half of this check.
    #[inline]
    fn check(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<Option<*mut u8>, AccessError> {
        if len != 0 {
            if let Some(r) = self.regions.get(key) {
                if r.window.is_none() && r.slotted.is_none() {
                    let offset = Self::check_region(r, key, pd, va, len, needed)?;
                    // SAFETY: offset + len <= r.len (check_region), so the offset stays
                    // inside the registered allocation.
                    return Ok(Some(unsafe { r.base.add(offset as usize) }));
                }
            }
        }
        self.check_any(key, pd, va, len, needed)
    }

    /// [`check`](Self::check) for every kind of region.
    #[inline(never)]
    fn check_any(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<Option<*mut u8>, AccessError> {
        if len == 0 {
            return Ok(Some(core::ptr::null_mut()));
        }
        let r = self.regions.get(key).ok_or(AccessError::InvalidKey(key))?;
        let offset = Self::check_region(r, key, pd, va, len, needed)?;
        if let Some(w) = &r.window {
            // A window is as alive as the region it opens onto.
            if !w.parent.is_some_and(|p| self.live(p)) {
                return Err(AccessError::InvalidKey(key));
            }
        }
        let Some(s) = &r.slotted else {
            // SAFETY: offset + len <= r.len (check_region), so the offset stays inside the
            // registered allocation.
            return Ok(Some(unsafe { r.base.add(offset as usize) }));
        };
        // A slotted region: the range must stay inside one share, and resolves to where
        // that share points now.
        let out = AccessError::Bounds { key, va, len };
        let (slot, within) = (offset / s.share, offset % s.share);
        if within + len > s.share {
            return Err(out);
        }
        match s.target(slot as u32).ok_or(out)? {
            SlotTarget::Discard => Ok(None),
            SlotTarget::Mapped {
                key: to,
                va: at,
                len: mapped,
            } => {
                if within + len > mapped {
                    return Err(out);
                }
                // The target is reached with its own rights: one level only.
                let t = self.regions.get(to).ok_or(out)?;
                if t.slotted.is_some() {
                    return Err(out);
                }
                let off = Self::check_region(t, to, pd, at + within, len, Access::LOCAL_WRITE)
                    .map_err(|_| out)?;
                // SAFETY: as above, for the target region.
                Ok(Some(unsafe { t.base.add(off as usize) }))
            }
        }
    }

    /// Checks validity, PD, rights and bounds of a `len`-byte access at `va` to region `r`
    /// (key `key`); returns the offset into it.
    fn check_region(
        r: &Region,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<u64, AccessError> {
        if r.valid.as_ref().is_some_and(|v| !v.load(Ordering::Acquire)) {
            return Err(AccessError::InvalidKey(key));
        }
        if r.pd != pd {
            return Err(AccessError::PdMismatch(key));
        }
        if !r.access.contains(needed) {
            return Err(AccessError::Permission {
                key,
                needed: needed.0,
            });
        }
        let out = AccessError::Bounds { key, va, len };
        let offset = va.checked_sub(r.iova).ok_or(out)?;
        let end = offset.checked_add(len).ok_or(out)?;
        if end > r.len as u64 {
            return Err(out);
        }
        Ok(offset)
    }

    /// [`check`](Self::check) for an access that must reach memory: a discarded share is
    /// out of bounds.
    fn check_present(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<*mut u8, AccessError> {
        self.check(key, pd, va, len, needed)?
            .ok_or(AccessError::Bounds { key, va, len })
    }

    /// Copies `data` into the region at `va`; needs `needed` rights (REMOTE_WRITE for a
    /// peer's WRITE, LOCAL_WRITE for a receive or a READ response landing).
    #[inline]
    pub fn write(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        data: &[u8],
        needed: Access,
    ) -> Result<(), AccessError> {
        let Some(dst) = self.check(key, pd, va, data.len() as u64, needed)? else {
            // A discarded share: the bytes go nowhere, as into a null MR.
            if let Some(s) = self.regions.get(key).and_then(|r| r.slotted.as_ref()) {
                s.discarded.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            return Ok(());
        };
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `check` bounded [offset, offset + len) inside the region, which the
        // registrant keeps valid for writes; `data` is a distinct Rust borrow, so the ranges
        // cannot overlap unless the application registered memory it also lent us as `data`,
        // which `copy_bytes` tolerates.
        unsafe { copy_bytes(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Lends `len` bytes of the region at `va` in place (needs `needed` rights), for a port
    /// that sends them without copying. The span borrows the table, so the region cannot be
    /// deregistered while it lives.
    pub fn span(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        len: usize,
        needed: Access,
    ) -> Result<MemSpan<'_>, AccessError> {
        let at = self.check_present(key, pd, va, len as u64, needed)?;
        let ptr = if len == 0 {
            core::ptr::NonNull::dangling().as_ptr()
        } else {
            at
        };
        Ok(MemSpan {
            ptr,
            len,
            _table: core::marker::PhantomData,
        })
    }

    /// Lends the bytes of every `(va, len)` of `ranges` under `key` (each checked as
    /// [`read`](Self::read) checks it) to `f` in place, without copying: for a computation
    /// over registered memory, such as encoding parity from a message's chunks. The table
    /// is borrowed meanwhile, so nothing can be deregistered under `f`.
    pub fn with_slices<R>(
        &self,
        key: u32,
        pd: PdId,
        ranges: &[(u64, usize)],
        needed: Access,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> Result<R, AccessError> {
        let mut slices: Vec<&[u8]> = Vec::with_capacity(ranges.len());
        for &(va, len) in ranges {
            let p = self.check_present(key, pd, va, len as u64, needed)?;
            slices.push(if len == 0 {
                &[]
            } else {
                // SAFETY: `check_present` bounded [va, va + len) inside the region, which
                // stays registered (and so valid) while `self` is borrowed. As with a span
                // an RNIC reads by DMA, the application may write the bytes meanwhile; what
                // `f` sees is then whatever it wrote, and nothing here relies on them.
                unsafe { core::slice::from_raw_parts(p, len) }
            });
        }
        Ok(f(&slices))
    }

    /// Copies from the region at `va` into `out`; needs `needed` rights (REMOTE_READ for a
    /// peer's READ, none for a local gather).
    #[inline]
    pub fn read(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        out: &mut [u8],
        needed: Access,
    ) -> Result<(), AccessError> {
        let src = self.check_present(key, pd, va, out.len() as u64, needed)?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `write`, the source range is inside the registered region.
        unsafe { copy_bytes(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn atomic(&self, key: u32, pd: PdId, va: u64) -> Result<&AtomicU64, AccessError> {
        self.atomic_with(key, pd, va, Access::REMOTE_ATOMIC)
    }

    /// The 8 bytes at `va` as an atomic, for an access that needs `needed`.
    fn atomic_with(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        needed: Access,
    ) -> Result<&AtomicU64, AccessError> {
        if !va.is_multiple_of(8) {
            return Err(AccessError::Misaligned(va));
        }
        let p = self.check_present(key, pd, va, 8, needed)?;
        if !p.cast::<u64>().is_aligned() {
            // The iova is aligned but the host address is not: cannot be an AtomicU64.
            return Err(AccessError::Misaligned(va));
        }
        // SAFETY: 8 bytes inside the region, aligned to 8, valid for the table's lifetime
        // bound below (the registrant keeps it valid until deregistration, which needs
        // `&mut self` and so cannot happen while this borrow lives).
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// Compare-and-swap on the 8 bytes at `va` (host byte order, as RDMA atomics are on the
    /// responder); returns the value found.
    pub fn compare_swap(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, AccessError> {
        let a = self.atomic(key, pd, va)?;
        Ok(
            match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Fetch-and-add on the 8 bytes at `va`; returns the value before the add.
    pub fn fetch_add(&self, key: u32, pd: PdId, va: u64, add: u64) -> Result<u64, AccessError> {
        Ok(self.atomic(key, pd, va)?.fetch_add(add, Ordering::SeqCst))
    }

    /// RDMA ATOMIC WRITE (IBTA 1.5): the 8 bytes `data` land at `va` in one store, so a
    /// reader never sees part of them (needs REMOTE_WRITE, an 8-byte aligned address).
    pub fn atomic_write(
        &self,
        key: u32,
        pd: PdId,
        va: u64,
        data: [u8; 8],
    ) -> Result<(), AccessError> {
        self.atomic_with(key, pd, va, Access::REMOTE_WRITE)?
            .store(u64::from_ne_bytes(data), Ordering::SeqCst);
        Ok(())
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.regions.len
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.regions.len == 0
    }
}

/// Copies `len` bytes between registered memory and a frame.
///
/// Not `memmove`: glibc's switches to `rep movsb` from a few KiB up, and on the AMD EPYC this
/// was measured on `rep movsb` between addresses that differ modulo 64 — every packet's
/// payload against its place in a frame, behind a header of 12 to 28 bytes — runs far slower
/// than a vector loop (AF_PACKET `gso`, 64 KiB WRITEs: about a tenth more throughput; the
/// transport benchmark's 4 KiB gathers spent three quarters of their copy in `rep movsb`).
/// A plain loop of 32-byte moves is no answer either: LLVM recognises it as a memcpy and
/// calls glibc after all (it did for the gathers), and without AVX it moves 16 bytes at a
/// time. So on x86-64 with AVX2 (checked once, at run time) the copy is explicit 32-byte
/// vector moves, four per turn, with the stores aligned.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes. The ranges may overlap (only
/// when an application lends registered memory as the other side); the bytes copied are then
/// unspecified, as under any RNIC, and nothing outside the two ranges is touched.
#[inline]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if len >= 128 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present; the caller's contract covers the ranges.
            unsafe { copy_avx2(src, dst, len) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { copy_portable(src, dst, len) };
}

/// [`copy_bytes`] without vector instructions beyond the target's baseline.
///
/// # Safety
/// As [`copy_bytes`].
#[inline]
unsafe fn copy_portable(src: *const u8, dst: *mut u8, len: usize) {
    const CHUNK: usize = 32;
    let mut i = 0;
    while i + CHUNK <= len {
        // SAFETY: i + CHUNK <= len, inside both ranges (caller's contract); unaligned
        // accesses of a byte array.
        unsafe {
            let v = core::ptr::read_unaligned(src.add(i).cast::<[u8; CHUNK]>());
            core::ptr::write_unaligned(dst.add(i).cast::<[u8; CHUNK]>(), v);
        }
        i += CHUNK;
    }
    if i < len {
        // SAFETY: the remaining `len - i` bytes are inside both ranges. (Skipped when none
        // remain: a call into memmove for nothing cost a 64-byte payload as much as its
        // copy.)
        unsafe { core::ptr::copy(src.add(i), dst.add(i), len - i) };
    }
}

/// [`copy_bytes`] with AVX2, for `len >= 128`: one unaligned 32-byte move covers the
/// destination's first bytes up to a 32-byte boundary, then 128 bytes per turn with aligned
/// stores, then 32 at a time, and a last unaligned move ending exactly at `len` (it may
/// rewrite bytes already written, with the same values unless the ranges overlap).
///
/// # Safety
/// As [`copy_bytes`], and the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use core::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_store_si256, _mm256_storeu_si256,
    };
    // SAFETY (whole body): every access is 32 bytes at an offset `o` with o + 32 <= len, so
    // inside both ranges by the caller's contract; `_mm256_store_si256` is used only where
    // `dst + o` is 32-byte aligned (after the head, `o` advances from an aligned start in
    // multiples of 32).
    unsafe {
        let ld = |o: usize| _mm256_loadu_si256(src.add(o).cast::<__m256i>());
        _mm256_storeu_si256(dst.cast::<__m256i>(), ld(0));
        let mut o = 32 - (dst as usize & 31);
        while o + 128 <= len {
            let (a, b, c, d) = (ld(o), ld(o + 32), ld(o + 64), ld(o + 96));
            _mm256_store_si256(dst.add(o).cast::<__m256i>(), a);
            _mm256_store_si256(dst.add(o + 32).cast::<__m256i>(), b);
            _mm256_store_si256(dst.add(o + 64).cast::<__m256i>(), c);
            _mm256_store_si256(dst.add(o + 96).cast::<__m256i>(), d);
            o += 128;
        }
        while o + 32 <= len {
            _mm256_store_si256(dst.add(o).cast::<__m256i>(), ld(o));
            o += 32;
        }
        if o < len {
            _mm256_storeu_si256(dst.add(len - 32).cast::<__m256i>(), ld(len - 32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: PdId = PdId(1);
    const RW: Access = Access::LOCAL_WRITE
        .with(Access::REMOTE_WRITE)
        .with(Access::REMOTE_READ)
        .with(Access::REMOTE_ATOMIC);

    fn table_with(buf: &mut [u64], access: Access) -> (MrTable, MrKeys) {
        let mut t = MrTable::new(7);
        // SAFETY: `buf` outlives the table in every test below.
        let keys =
            unsafe { t.register(PD, buf.as_mut_ptr().cast(), buf.len() * 8, 0x1000, access) }
                .unwrap();
        (t, keys)
    }

    #[test]
    fn keys_name_slots_and_a_stale_key_is_refused_after_its_slot_is_reused() {
        let mut buf = vec![0u64; 64];
        let (mut t, k1) = table_with(&mut buf, RW);
        let p = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: `buf` outlives the table.
        let k2 = unsafe { t.register(PD, p, 8, 0, RW) }.unwrap();
        assert_ne!(k1.lkey, k2.lkey);
        assert_eq!((slot_of(k1.lkey), slot_of(k2.lkey)), (1, 2));
        assert!(t.deregister(k1));
        assert!(!t.deregister(k1), "gone");
        // The freed slot is reused (freed slots are taken first in, first out), under a new
        // tag, so the stale key stays refused.
        // SAFETY: as above.
        let k3 = unsafe { t.register(PD, p, 8, 0, RW) }.unwrap();
        assert_eq!(slot_of(k3.lkey), 1, "the freed slot is the only free one");
        assert_ne!(k3.lkey, k1.lkey, "a new tag");
        assert_eq!(
            t.read(k1.lkey, PD, 0x1000, &mut [0u8; 1], Access::NONE),
            Err(AccessError::InvalidKey(k1.lkey))
        );
        assert_eq!(t.len(), 2);
        // Keys that name no slot, or slot 0's forbidden encoding.
        for bad in [0u32, INDEX_MASK, 0xfff0_0000, k2.lkey ^ 0x8000_0000] {
            assert!(
                t.check_access(bad, PD, 0, 8, Access::NONE).is_err(),
                "{bad:#x}"
            );
        }
        // Another seed, other keys.
        let mut other = MrTable::new(8);
        // SAFETY: as above.
        let ko = unsafe { other.register(PD, p, 8, 0, RW) }.unwrap();
        assert_eq!(slot_of(ko.lkey), 1);
        assert_ne!(ko.lkey, k1.lkey);
    }

    #[test]
    fn an_adopted_region_keeps_its_slot_in_the_adopting_table() {
        let mut owner = MrTable::new(7);
        let mut keys = Vec::new();
        for _ in 0..5 {
            keys.push(owner.register_owned(PD, 64, RW).unwrap().0);
        }
        let mut copy = MrTable::new(9);
        // Adopted out of order: slots past the end are grown to, the gaps stay free.
        for &k in [keys[3], keys[0], keys[4]].iter() {
            assert!(copy.adopt(&owner.share(k).unwrap()));
        }
        assert!(!copy.adopt(&owner.share(keys[0]).unwrap()), "already there");
        assert_eq!(copy.len(), 3);
        for &k in &[keys[3], keys[0], keys[4]] {
            assert!(copy
                .check_access(k.rkey, PD, owner.extent(k.lkey).unwrap().0 as u64, 8, RW)
                .is_ok());
        }
        assert!(copy.check_access(keys[1].rkey, PD, 0, 8, RW).is_err());
        assert!(copy.adopt(&owner.share(keys[1]).unwrap()), "into a gap");
        assert_eq!(copy.len(), 4);
    }

    #[test]
    fn an_adopted_region_has_the_same_keys_memory_and_one_validity() {
        let mut owner = MrTable::new(7);
        let (keys, addr) = owner.register_owned(PD, 64, RW).unwrap();
        let mut copies = [MrTable::new(8), MrTable::new(9)];
        let share = owner.share(keys).unwrap();
        assert_eq!(share.keys(), keys);
        for c in &mut copies {
            assert!(c.adopt(&share));
            assert!(!c.adopt(&share), "adopted twice");
        }
        // A write through one copy is read through the owner and the other copy; an atomic
        // through one is seen by the next.
        copies[0]
            .write(keys.rkey, PD, addr + 8, b"abcdefgh", Access::REMOTE_WRITE)
            .unwrap();
        for t in [&owner, &copies[1]] {
            let mut out = [0u8; 8];
            t.read(keys.lkey, PD, addr + 8, &mut out, Access::NONE)
                .unwrap();
            assert_eq!(&out, b"abcdefgh");
        }
        assert_eq!(copies[1].fetch_add(keys.rkey, PD, addr, 5).unwrap(), 0);
        assert_eq!(owner.fetch_add(keys.rkey, PD, addr, 1).unwrap(), 5);
        // Bounds and rights are the owner's.
        assert_eq!(
            copies[0].write(keys.rkey, PD, addr + 60, &[0; 8], Access::REMOTE_WRITE),
            Err(AccessError::Bounds {
                key: keys.rkey,
                va: addr + 60,
                len: 8
            })
        );
        assert_eq!(
            copies[1].invalidate(keys.rkey, PdId(2)),
            Err(AccessError::PdMismatch(keys.rkey))
        );
        // Invalidated through one copy: dead in all three, and a second invalidation fails.
        copies[1].invalidate(keys.rkey, PD).unwrap();
        for t in [&owner, &copies[0], &copies[1]] {
            let mut out = [0u8; 8];
            assert_eq!(
                t.read(keys.lkey, PD, addr, &mut out, Access::NONE),
                Err(AccessError::InvalidKey(keys.lkey))
            );
        }
        assert_eq!(
            owner.invalidate(keys.rkey, PD),
            Err(AccessError::InvalidKey(keys.rkey))
        );
        // The owner's table lets go first; the memory it allocated lives on in the copies.
        assert!(owner.deregister(keys));
        assert!(owner.share(keys).is_none());
        drop(owner);
        let share = copies[0].share(keys).unwrap();
        share.valid.store(true, Ordering::Release);
        copies[0]
            .write(keys.rkey, PD, addr + 16, b"still", Access::REMOTE_WRITE)
            .unwrap();
        for c in &mut copies {
            assert!(c.deregister(keys));
        }
    }

    #[test]
    fn copies_of_every_length_and_offset_are_exact_and_stay_inside() {
        // Lengths around the 32-byte chunk, at every offset within a chunk; the bytes just
        // outside each copied range must keep their guard value.
        let mut buf = vec![0u64; 1024];
        let (t, k) = table_with(&mut buf, RW);
        // 127/128/129 and up take the vector path, whose head and tail overlap its body.
        for len in [
            0usize, 1, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 160, 191, 4096, 4097,
        ] {
            for off in 1..66u64 {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                let guard = vec![0xa5u8; len + 2];
                t.write(k.rkey, PD, 0x1000 + off - 1, &guard, RW).unwrap();
                t.write(k.rkey, PD, 0x1000 + off, &data, RW).unwrap();
                let mut back = vec![0u8; len + 2];
                t.read(k.lkey, PD, 0x1000 + off - 1, &mut back, Access::NONE)
                    .unwrap();
                assert_eq!(back[0], 0xa5, "len {len} off {off}");
                assert_eq!(&back[1..=len], &data[..], "len {len} off {off}");
                assert_eq!(back[len + 1], 0xa5, "len {len} off {off}");
            }
        }
    }

    #[test]
    fn writes_reads_and_atomics_land_inside_the_region() {
        let mut buf = [0u64; 8];
        let (t, k) = table_with(&mut buf, RW);
        t.write(k.rkey, PD, 0x1008, &[1, 2, 3], Access::REMOTE_WRITE)
            .unwrap();
        let mut out = [0u8; 3];
        t.read(k.rkey, PD, 0x1008, &mut out, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(t.fetch_add(k.rkey, PD, 0x1010, 5).unwrap(), 0);
        assert_eq!(t.compare_swap(k.rkey, PD, 0x1010, 5, 9).unwrap(), 5);
        assert_eq!(t.compare_swap(k.rkey, PD, 0x1010, 5, 1).unwrap(), 9);
        drop(t);
        assert_eq!(buf[2], 9);
        assert_eq!(buf[1].to_ne_bytes()[..3], [1, 2, 3]);
    }

    #[test]
    fn every_violation_is_refused_and_writes_nothing() {
        let mut buf = [0u64; 4];
        let (mut t, k) = table_with(&mut buf, Access::LOCAL_WRITE.with(Access::REMOTE_READ));
        let w = |t: &MrTable, key, pd, va| t.write(key, pd, va, &[0xff; 8], Access::REMOTE_WRITE);
        assert!(matches!(
            w(&t, k.rkey, PD, 0x1000),
            Err(AccessError::Permission { .. })
        ));
        assert_eq!(
            w(&t, k.rkey ^ 1, PD, 0x1000),
            Err(AccessError::InvalidKey(k.rkey ^ 1))
        );
        assert_eq!(
            w(&t, k.rkey, PdId(2), 0x1000),
            Err(AccessError::PdMismatch(k.rkey))
        );
        let local = |t: &MrTable, va| t.write(k.lkey, PD, va, &[0xff; 8], Access::LOCAL_WRITE);
        assert!(local(&t, 0x1000 + 32 - 8).is_ok());
        assert!(matches!(
            local(&t, 0x1000 + 32 - 7),
            Err(AccessError::Bounds { .. })
        ));
        assert!(matches!(local(&t, 0xff8), Err(AccessError::Bounds { .. })));
        assert!(matches!(
            local(&t, u64::MAX - 2),
            Err(AccessError::Bounds { .. })
        ));
        assert!(matches!(
            t.fetch_add(k.rkey, PD, 0x1000, 1),
            Err(AccessError::Permission { .. })
        ));
        // Zero-length accesses pass with any key.
        assert!(t
            .write(0xdead, PdId(9), 0, &[], Access::REMOTE_WRITE)
            .is_ok());
        assert!(t.deregister(k));
        assert_eq!(local(&t, 0x1000), Err(AccessError::InvalidKey(k.lkey)));
        drop(t);
        assert_eq!(buf, [0, 0, 0, 0xffff_ffff_ffff_ffff]);
    }

    #[test]
    fn atomics_must_be_aligned() {
        let mut buf = [0u64; 4];
        let (t, k) = table_with(&mut buf, RW);
        assert_eq!(
            t.fetch_add(k.rkey, PD, 0x1004, 1),
            Err(AccessError::Misaligned(0x1004))
        );
    }

    #[test]
    fn registration_rules_and_key_randomness() {
        let mut t = MrTable::new(1);
        let mut buf = [0u8; 16];
        // SAFETY: `buf` outlives `t`.
        let bad = unsafe { t.register(PD, buf.as_mut_ptr(), 16, 0, Access::REMOTE_WRITE) };
        assert_eq!(bad, Err(RegisterError::RemoteWriteNeedsLocalWrite));
        let keys: Vec<u32> = (0..64)
            // SAFETY: as above.
            .map(|_| {
                unsafe { t.register(PD, buf.as_mut_ptr(), 16, 0, Access::NONE) }
                    .unwrap()
                    .rkey
            })
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 64);
        assert!(
            keys.windows(2)
                .filter(|w| w[1] == w[0].wrapping_add(1))
                .count()
                < 2
        );
        // Same seed, same keys (the simulator replays).
        let mut again = MrTable::new(1);
        // SAFETY: as above.
        let first = unsafe { again.register(PD, buf.as_mut_ptr(), 16, 0, Access::NONE) }.unwrap();
        assert_eq!(first.rkey, keys[0]);
    }

    #[test]
    fn a_slotted_region_writes_through_its_shares_and_discards_the_rest() {
        let mut t = MrTable::new(3);
        let (buf, _) = t.register_owned(PD, 256, Access::LOCAL_WRITE).unwrap();
        let base = t.extent(buf.lkey).unwrap().0 as u64;
        let (region, map) = t
            .register_slotted(PD, 4, 64, Access::LOCAL_WRITE.with(Access::REMOTE_WRITE))
            .unwrap();
        assert_eq!(t.extent(region.lkey), None, "no memory of its own to map");
        // Every share starts discarded: a write vanishes, counted; a read is refused.
        t.write(region.rkey, PD, 70, &[9; 8], Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(map.discarded_bytes(), 8);
        assert!(t
            .read(region.lkey, PD, 70, &mut [0; 8], Access::NONE)
            .is_err());
        // Share 1 onto 32 bytes at offset 100 of the buffer.
        let target = SlotTarget::Mapped {
            key: buf.lkey,
            va: base + 100,
            len: 32,
        };
        assert!(map.map(1, target));
        assert!(!map.map(4, target), "no share 4");
        assert!(
            !map.map(
                0,
                SlotTarget::Mapped {
                    key: buf.lkey,
                    va: base,
                    len: 65
                }
            ),
            "longer than a share"
        );
        t.write(region.rkey, PD, 64 + 4, &[7; 8], Access::REMOTE_WRITE)
            .unwrap();
        let mut got = [0u8; 16];
        t.read(buf.lkey, PD, base + 100, &mut got, Access::NONE)
            .unwrap();
        assert_eq!(got, [0, 0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0]);
        // Past the mapped 32 bytes, across a share's end, past the region, another PD, no
        // right: refused, nothing written.
        for (va, len, pd, need) in [
            (64 + 30, 4, PD, Access::REMOTE_WRITE),
            (60, 8, PD, Access::REMOTE_WRITE),
            (256, 1, PD, Access::REMOTE_WRITE),
            (64, 4, PdId(2), Access::REMOTE_WRITE),
            (64, 4, PD, Access::REMOTE_READ),
        ] {
            assert!(
                t.write(region.rkey, pd, va, &vec![1; len], need).is_err(),
                "{va} {len}"
            );
        }
        let mut all = vec![0u8; 256];
        t.read(buf.lkey, PD, base, &mut all, Access::NONE).unwrap();
        assert_eq!(all.iter().filter(|&&b| b != 0).count(), 8);
        // Back to discard: the same write now vanishes.
        assert!(map.map(1, SlotTarget::Discard));
        t.write(region.rkey, PD, 64 + 4, &[5; 8], Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(map.discarded_bytes(), 16);
        t.read(buf.lkey, PD, base + 104, &mut got[..8], Access::NONE)
            .unwrap();
        assert_eq!(got[..8], [7; 8]);
        // A target deregistered after mapping is refused at the access.
        assert!(map.map(2, target));
        assert!(t.deregister(buf));
        assert!(t
            .write(region.rkey, PD, 128, &[1], Access::REMOTE_WRITE)
            .is_err());
    }
}
