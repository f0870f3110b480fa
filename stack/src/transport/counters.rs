//! Per-QP counters, named after the Linux RDMA hardware counters (`/sys/class/infiniband/*/
//! ports/*/hw_counters`, mlx5's names) where one exists, so numbers from ferroce and from a
//! ConnectX read the same.

crate::counter_set! {
    /// Event counts of one QP.
    pub struct Counters {
        /// Packets transmitted.
        tx_packets,
        /// Bytes transmitted (whole frames).
        tx_bytes,
        /// Packets handed to the QP.
        rx_packets,
        /// Bytes handed to the QP (whole frames).
        rx_bytes,
        /// Request packets sent again (Go-Back-N rewinds, READ re-issues).
        retransmitted_packets,
        /// Responder: requests that arrived ahead of the expected PSN.
        out_of_sequence,
        /// Requester: PSN sequence error NAKs received.
        packet_seq_err,
        /// Responder: duplicate requests (re-ACKed, READs re-executed, atomics replayed).
        duplicate_request,
        /// Requester: RNR retries exhausted.
        rnr_nak_retry_err,
        /// Requester: RNR NAKs received.
        rnr_naks_received,
        /// Requester: local ACK timeouts.
        local_ack_timeout_err,
        /// Requester: READ/atomic responses missing before a later response (implied NAK).
        implied_nak_seq_err,
        /// Responder: requests that found no receive WQE (answered with an RNR NAK on RC).
        out_of_buffer,
        /// Responder: WRITE requests executed.
        rx_write_requests,
        /// Responder: READ requests executed (re-executions included).
        rx_read_requests,
        /// Responder: atomic requests executed (replays excluded).
        rx_atomic_requests,
        /// Responder: atomic results replayed from the cache for duplicates.
        atomic_replays,
        /// Responder: ACK packets sent (RNR and sequence NAKs excluded).
        acks_sent,
        /// Responder: NAKs sent, of every kind.
        naks_sent,
        /// Requester: NAK invalid request received.
        req_remote_invalid_request,
        /// Requester: NAK remote access error received.
        req_remote_access_errors,
        /// Responder: remote access violations refused.
        resp_remote_access_errors,
        /// Responder: messages longer than the receive buffer.
        resp_local_length_error,
        /// Requester: completions with an error other than flush.
        req_cqe_error,
        /// Responder: completions with an error other than flush.
        resp_cqe_error,
        /// Requester: completions flushed.
        req_cqe_flush_error,
        /// Responder: completions flushed.
        resp_cqe_flush_error,
        /// UD: packets dropped for a Q_Key mismatch.
        qkey_violations,
        /// Packets dropped as invalid for this QP (wrong transport, state, or malformed sequence).
        rx_dropped,
        /// Responses and ACKs that matched nothing outstanding.
        ghost_responses,
        /// Responder: requests the parser refused after their BTH (an opcode ferroce does not
        /// speak, bytes the opcode forbids, headers cut short, an impossible pad).
        malformed_requests,
        /// Requester: responses that do not fit what they answer (unexpected opcode, wrong
        /// length, a NAK or reserved syndrome where only an ACK may stand, a malformed frame),
        /// ending the request with BAD_RESP_ERR.
        bad_responses,
        /// Responder (placement): WRITE packets placed ahead of the expected PSN.
        ooo_placed,
        /// Responder (placement): requests ahead of the expected PSN held for their turn.
        ooo_held,
        /// Responder (selective repeat): PSNs reported lost to the requester.
        loss_reports_sent,
        /// Requester (selective repeat): loss reports received.
        loss_reports_received,
        /// Requester (selective repeat): selective acknowledgements received.
        sacks_received,
        /// Requester (selective repeat): paths the responder asked to avoid.
        path_avoidances,
        /// Requester (placement): READ responses and atomic ACKs placed ahead of the oldest
        /// unacknowledged PSN.
        ooo_responses_placed,
        /// Requester (placement): responses the policy found lost and asked for again.
        response_losses_detected,
        /// Requester: congestion notification packets handed to congestion control (mlx5's
        /// reaction-point name).
        rp_cnp_handled,
        /// Packets that arrived with ECN Congestion Experienced (mlx5's notification-point
        /// name).
        np_ecn_marked_roce_packets,
        /// CNPs sent for them, at most one per QP per `min_time_between_cnps`.
        np_cnp_sent,
    }
}
