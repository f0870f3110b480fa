/* Loopback through a libibverbs, as on a ConnectX port: two RC QPs of one process connect
 * to each other by the port's own GID and run a SEND, a WRITE, a READ and a FETCH_ADD,
 * checked byte for byte, in three pairings: two QPs of one context, QPs of two contexts of
 * one device, and QPs of two devices the process opened on the same interface
 * (FERROCE_DEVICES naming it twice). scripts/ibverbs-test.sh builds this against
 * rdma-core's header, runs it over ferroce's library on a veth end and checks from the
 * interface's counters that no frame left.
 *   loopback
 * Exit status 0 when every check holds. */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN 65536

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
};

static void die(const char *what)
{
	fprintf(stderr, "loopback: %s\n", what);
	exit(1);
}

static void make(struct side *s, struct ibv_context *ctx)
{
	s->ctx = ctx;
	s->pd = ibv_alloc_pd(ctx);
	s->cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	s->buf = calloc(1, LEN);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;
	s->mr = s->pd ? ibv_reg_mr(s->pd, s->buf, LEN, acc) : NULL;
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	s->qp = s->cq && s->mr ? ibv_create_qp(s->pd, &ia) : NULL;
	if (!s->qp)
		die("pd/cq/mr/qp");
}

static void connect_to(struct side *s, struct side *peer)
{
	union ibv_gid gid;
	if (ibv_query_gid(peer->ctx, 1, 0, &gid))
		die("query_gid");
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC,
	};
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 11;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					     IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 11;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
					     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					     IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;
	for (long i = 0; (n = ibv_poll_cq(cq, 1, &wc)) == 0; i++)
		if (i == 200000000)
			die("no completion");
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "loopback: completion %s\n", ibv_wc_status_str(wc.status));
		exit(1);
	}
	return wc;
}

static void destroy(struct side *s)
{
	if (ibv_destroy_qp(s->qp) || ibv_destroy_cq(s->cq) || ibv_dereg_mr(s->mr) ||
	    ibv_dealloc_pd(s->pd))
		die("destroy");
	free(s->buf);
}

/* One pairing: a on ca, b on cb. */
static void run(const char *name, struct ibv_context *ca, struct ibv_context *cb)
{
	struct side a, b;
	make(&a, ca);
	make(&b, cb);
	connect_to(&a, &b);
	connect_to(&b, &a);
	for (int i = 0; i < LEN; i++)
		a.buf[i] = (uint8_t)(i * 31 + 7);
	struct ibv_sge rs = { (uintptr_t)b.buf, 4096, b.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 9, .sg_list = &rs, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(b.qp, &rw, &rbad))
		die("post_recv");
	struct ibv_sge s_send = { (uintptr_t)a.buf, 4096, a.mr->lkey };
	struct ibv_sge s_write = { (uintptr_t)a.buf + 4096, 16384, a.mr->lkey };
	struct ibv_sge s_read = { (uintptr_t)a.buf + 32768, 16384, a.mr->lkey };
	struct ibv_sge s_fa = { (uintptr_t)a.buf + 60000, 8, a.mr->lkey };
	*(uint64_t *)(b.buf + 60000) = 40;
	struct ibv_send_wr fa = {
		.wr_id = 4, .sg_list = &s_fa, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = (uintptr_t)b.buf + 60000, .compare_add = 2,
			       .rkey = b.mr->rkey },
	};
	struct ibv_send_wr rd = {
		.wr_id = 3, .next = &fa, .sg_list = &s_read, .num_sge = 1,
		.opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 4096, .rkey = b.mr->rkey },
	};
	struct ibv_send_wr wr = {
		.wr_id = 2, .next = &rd, .sg_list = &s_write, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)b.buf + 4096, .rkey = b.mr->rkey },
	};
	struct ibv_send_wr sd = {
		.wr_id = 1, .next = &wr, .sg_list = &s_send, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	if (ibv_post_send(a.qp, &sd, &bad))
		die("post_send");
	for (uint64_t id = 1; id <= 4; id++)
		if (wait_wc(a.cq).wr_id != id)
			die("completions out of order");
	struct ibv_wc r = wait_wc(b.cq);
	if (r.wr_id != 9 || r.byte_len != 4096 || r.opcode != IBV_WC_RECV)
		die("the SEND's receive");
	if (memcmp(b.buf, a.buf, 4096))
		die("SEND bytes differ");
	if (memcmp(b.buf + 4096, a.buf + 4096, 16384))
		die("WRITE bytes differ");
	if (memcmp(a.buf + 32768, a.buf + 4096, 16384))
		die("READ bytes differ");
	if (*(uint64_t *)(a.buf + 60000) != 40 || *(uint64_t *)(b.buf + 60000) != 42)
		die("FETCH_ADD");
	destroy(&a);
	destroy(&b);
	printf("loopback: %s: SEND, WRITE, READ, FETCH_ADD by the port's own GID\n", name);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("no device");
	struct ibv_context *c0 = ibv_open_device(list[0]);
	struct ibv_context *c0b = ibv_open_device(list[0]);
	if (!c0 || !c0b)
		die("open_device");
	run("two QPs of one context", c0, c0);
	run("two contexts of one device", c0, c0b);
	if (n >= 2) {
		struct ibv_context *c1 = ibv_open_device(list[1]);
		if (!c1)
			die("open_device 1");
		run("two devices on one interface", c0, c1);
		ibv_close_device(c1);
	}
	ibv_close_device(c0b);
	ibv_close_device(c0);
	ibv_free_device_list(list);
	return 0;
}
