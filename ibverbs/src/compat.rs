//! libibverbs' helpers that need no device: the copies between the kernel's structures and
//! the verbs ones that librdmacm uses (`ibv_copy_*_kern`, libibverbs' "marshall" functions),
//! and the conversions between `enum ibv_rate`, link-width multiples of 2.5 Gb/s and Mb/s.

use std::ffi::c_int;

use crate::ffi;

/// `ibv_copy_ah_attr_from_kern`.
///
/// # Safety
/// Both point to their structures.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_copy_ah_attr_from_kern(
    dst: *mut ffi::ibv_ah_attr,
    src: *const ffi::ib_uverbs_ah_attr,
) {
    // SAFETY: per the contract.
    let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
        return;
    };
    copy_ah_from_kern(d, s);
}
symver!(ferroce_ibv_copy_ah_attr_from_kern => "ibv_copy_ah_attr_from_kern" @ "IBVERBS_1.1");

fn copy_ah_from_kern(d: &mut ffi::ibv_ah_attr, s: &ffi::ib_uverbs_ah_attr) {
    d.grh.dgid.raw = s.grh.dgid;
    d.grh.flow_label = s.grh.flow_label;
    d.grh.sgid_index = s.grh.sgid_index;
    d.grh.hop_limit = s.grh.hop_limit;
    d.grh.traffic_class = s.grh.traffic_class;
    d.dlid = s.dlid;
    d.sl = s.sl;
    d.src_path_bits = s.src_path_bits;
    d.static_rate = s.static_rate;
    d.is_global = s.is_global;
    d.port_num = s.port_num;
}

/// `ibv_copy_qp_attr_from_kern`.
///
/// # Safety
/// Both point to their structures.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_copy_qp_attr_from_kern(
    dst: *mut ffi::ibv_qp_attr,
    src: *const ffi::ib_uverbs_qp_attr,
) {
    // SAFETY: per the contract.
    let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
        return;
    };
    d.cur_qp_state = s.cur_qp_state;
    d.path_mtu = s.path_mtu;
    d.path_mig_state = s.path_mig_state;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags;
    d.cap.max_send_wr = s.max_send_wr;
    d.cap.max_recv_wr = s.max_recv_wr;
    d.cap.max_send_sge = s.max_send_sge;
    d.cap.max_recv_sge = s.max_recv_sge;
    d.cap.max_inline_data = s.max_inline_data;
    copy_ah_from_kern(&mut d.ah_attr, &s.ah_attr);
    copy_ah_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}
symver!(ferroce_ibv_copy_qp_attr_from_kern => "ibv_copy_qp_attr_from_kern" @ "IBVERBS_1.0");

/// Copies the fields two path record layouts share (the kernel's and libibverbs').
macro_rules! copy_path {
    ($d:expr, $s:expr) => {{
        $d.dlid = $s.dlid;
        $d.slid = $s.slid;
        $d.raw_traffic = $s.raw_traffic as _;
        $d.flow_label = $s.flow_label;
        $d.hop_limit = $s.hop_limit;
        $d.traffic_class = $s.traffic_class;
        $d.reversible = $s.reversible as _;
        $d.numb_path = $s.numb_path;
        $d.pkey = $s.pkey;
        $d.sl = $s.sl;
        $d.mtu_selector = $s.mtu_selector;
        $d.mtu = $s.mtu as _;
        $d.rate_selector = $s.rate_selector;
        $d.rate = $s.rate;
        $d.packet_life_time = $s.packet_life_time;
        $d.preference = $s.preference;
        $d.packet_life_time_selector = $s.packet_life_time_selector;
    }};
}

/// `ibv_copy_path_rec_from_kern`.
///
/// # Safety
/// Both point to their structures.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_copy_path_rec_from_kern(
    dst: *mut ffi::ibv_sa_path_rec,
    src: *const ffi::ib_user_path_rec,
) {
    // SAFETY: per the contract.
    let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
        return;
    };
    d.dgid.raw = s.dgid;
    d.sgid.raw = s.sgid;
    copy_path!(d, s);
}
symver!(ferroce_ibv_copy_path_rec_from_kern => "ibv_copy_path_rec_from_kern" @ "IBVERBS_1.0");

/// `ibv_copy_path_rec_to_kern`.
///
/// # Safety
/// Both point to their structures.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ibv_copy_path_rec_to_kern(
    dst: *mut ffi::ib_user_path_rec,
    src: *const ffi::ibv_sa_path_rec,
) {
    // SAFETY: per the contract.
    let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
        return;
    };
    // SAFETY: every 16-byte pattern is a valid `raw` view of the union.
    unsafe {
        d.dgid = s.dgid.raw;
        d.sgid = s.sgid.raw;
    }
    copy_path!(d, s);
}
symver!(ferroce_ibv_copy_path_rec_to_kern => "ibv_copy_path_rec_to_kern" @ "IBVERBS_1.0");

/// IBTA's static rate encodings (`enum ibv_rate`) with their multiple of 2.5 Gb/s (where the
/// rate is one, else -1) and their data rate in Mb/s.
const RATES: &[(ffi::ibv_rate, c_int, c_int)] = &[
    (ffi::IBV_RATE_2_5_GBPS, 1, 2500),
    (ffi::IBV_RATE_5_GBPS, 2, 5000),
    (ffi::IBV_RATE_10_GBPS, 4, 10000),
    (ffi::IBV_RATE_20_GBPS, 8, 20000),
    (ffi::IBV_RATE_30_GBPS, 12, 30000),
    (ffi::IBV_RATE_40_GBPS, 16, 40000),
    (ffi::IBV_RATE_60_GBPS, 24, 60000),
    (ffi::IBV_RATE_80_GBPS, 32, 80000),
    (ffi::IBV_RATE_120_GBPS, 48, 120000),
    (ffi::IBV_RATE_14_GBPS, -1, 14062),
    (ffi::IBV_RATE_56_GBPS, -1, 56250),
    (ffi::IBV_RATE_112_GBPS, -1, 112500),
    (ffi::IBV_RATE_168_GBPS, -1, 168750),
    (ffi::IBV_RATE_25_GBPS, -1, 25781),
    (ffi::IBV_RATE_100_GBPS, -1, 103125),
    (ffi::IBV_RATE_200_GBPS, -1, 206250),
    (ffi::IBV_RATE_300_GBPS, -1, 309375),
    (ffi::IBV_RATE_28_GBPS, 11, 28125),
    (ffi::IBV_RATE_50_GBPS, 20, 53125),
    (ffi::IBV_RATE_400_GBPS, 160, 425000),
    (ffi::IBV_RATE_600_GBPS, 240, 637500),
    (ffi::IBV_RATE_800_GBPS, 320, 850000),
    (ffi::IBV_RATE_1200_GBPS, 480, 1275000),
];

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s, or -1.
#[no_mangle]
pub extern "C" fn ferroce_ibv_rate_to_mult(rate: ffi::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}
symver!(ferroce_ibv_rate_to_mult => "ibv_rate_to_mult" @ "IBVERBS_1.0");

/// `mult_to_ibv_rate`: the rate of a multiple of 2.5 Gb/s, or `IBV_RATE_MAX`.
#[no_mangle]
pub extern "C" fn ferroce_mult_to_ibv_rate(mult: c_int) -> ffi::ibv_rate {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(ffi::IBV_RATE_MAX, |r| r.0)
}
symver!(ferroce_mult_to_ibv_rate => "mult_to_ibv_rate" @ "IBVERBS_1.0");

/// `ibv_rate_to_mbps`: the rate's data rate in Mb/s, or -1.
#[no_mangle]
pub extern "C" fn ferroce_ibv_rate_to_mbps(rate: ffi::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}
symver!(ferroce_ibv_rate_to_mbps => "ibv_rate_to_mbps" @ "IBVERBS_1.1");

/// `mbps_to_ibv_rate`: the rate of a data rate in Mb/s, or `IBV_RATE_MAX`.
#[no_mangle]
pub extern "C" fn ferroce_mbps_to_ibv_rate(mbps: c_int) -> ffi::ibv_rate {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(ffi::IBV_RATE_MAX, |r| r.0)
}
symver!(ferroce_mbps_to_ibv_rate => "mbps_to_ibv_rate" @ "IBVERBS_1.1");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_round_trip() {
        assert_eq!(ferroce_ibv_rate_to_mult(ffi::IBV_RATE_40_GBPS), 16);
        assert_eq!(ferroce_mult_to_ibv_rate(16), ffi::IBV_RATE_40_GBPS);
        assert_eq!(ferroce_ibv_rate_to_mult(ffi::IBV_RATE_100_GBPS), -1);
        assert_eq!(ferroce_mult_to_ibv_rate(3), ffi::IBV_RATE_MAX);
        assert_eq!(ferroce_mult_to_ibv_rate(-1), ffi::IBV_RATE_MAX);
        for &(r, _, mbps) in RATES {
            assert_eq!(ferroce_mbps_to_ibv_rate(ferroce_ibv_rate_to_mbps(r)), r);
            assert_eq!(ferroce_ibv_rate_to_mbps(r), mbps);
        }
        assert_eq!(ferroce_ibv_rate_to_mbps(ffi::IBV_RATE_MAX), -1);
    }
}
