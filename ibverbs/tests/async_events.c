/* Asynchronous events through a libibverbs, as a program sees them: a non-blocking, pollable
 * async_fd; IBV_EVENT_PORT_ERR and PORT_ACTIVE when the interface goes down and up;
 * QP_REQ_ERR, QP_ACCESS_ERR and QP_FATAL on a responder that gets a SEND too long for its
 * receive, a WRITE with a bad rkey, a SEND into a receive whose memory was deregistered;
 * SRQ_LIMIT_REACHED once an armed SRQ drains below its limit; QP_LAST_WQE_REACHED when a
 * QP on an SRQ enters the error state; CQ_ERR when a CQ overflows; and ibv_destroy_qp
 * waiting until the program acknowledged the events it took for the QP. Each event names
 * the right object. One process, QPs connected to each other by the port's own GID
 * (loopback), so the only network it needs is the device's interface.
 * scripts/ibverbs-test.sh builds this against rdma-core's header and runs it over
 * ferroce's library in a namespace whose veth end it may take down.
 *   async_events IFACE
 * Exit status 0 when every check holds. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEN 4096

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static void die(const char *what)
{
	fprintf(stderr, "async_events: %s (errno %d)\n", what, errno);
	exit(1);
}

/* The next event, within 5 s (the fd must become readable: poll, then a get that does not
 * block). */
static struct ibv_async_event next_event(void)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event e;
	if (poll(&p, 1, 5000) != 1)
		die("no event within 5 s");
	if (ibv_get_async_event(ctx, &e))
		die("get_async_event after poll said readable");
	return e;
}

/* The next event, which must be `want`; not yet acknowledged. */
static struct ibv_async_event expect(enum ibv_event_type want)
{
	struct ibv_async_event e = next_event();
	if (e.event_type != want) {
		fprintf(stderr, "async_events: got %s, want %s\n", ibv_event_type_str(e.event_type),
			ibv_event_type_str(want));
		exit(1);
	}
	printf("event %s\n", ibv_event_type_str(want));
	return e;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;
	for (long i = 0; (n = ibv_poll_cq(cq, 1, &wc)) == 0; i++) {
		if (i == 50000000)
			die("no completion");
	}
	if (n < 0)
		die("poll_cq");
	return wc;
}

static void to_rts(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 100;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 100;
	a.timeout = 10;
	a.retry_cnt = 2;
	a.rnr_retry = 2;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

struct pair {
	struct ibv_cq *cq_a, *cq_b;
	struct ibv_qp *a, *b;
};

/* Two RC QPs connected to each other through the port's own GID; b on `srq` if given. */
static struct pair connected(struct ibv_srq *srq, int cqe_a)
{
	struct pair p;
	p.cq_a = ibv_create_cq(ctx, cqe_a, NULL, NULL, 0);
	p.cq_b = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!p.cq_a || !p.cq_b)
		die("create_cq");
	struct ibv_qp_init_attr ia = {
		.send_cq = p.cq_a, .recv_cq = p.cq_a, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 32, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_init_attr ib = ia;
	ib.send_cq = ib.recv_cq = p.cq_b;
	ib.srq = srq;
	p.a = ibv_create_qp(pd, &ia);
	p.b = ibv_create_qp(pd, &ib);
	if (!p.a || !p.b)
		die("create_qp");
	to_rts(p.a, p.b->qp_num);
	to_rts(p.b, p.a->qp_num);
	return p;
}

static void post_recv(struct ibv_qp *qp, struct ibv_srq *srq, struct ibv_mr *mr, uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)mr->addr, len, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = 9, .sg_list = &s, .num_sge = 1 }, *bad;
	if (srq ? ibv_post_srq_recv(srq, &w, &bad) : ibv_post_recv(qp, &w, &bad))
		die("post_recv");
}

static void post_send(struct ibv_qp *qp, struct ibv_mr *mr, uint32_t len, enum ibv_wr_opcode op,
		      uint32_t rkey, int signaled)
{
	struct ibv_sge s = { (uintptr_t)mr->addr, len, mr->lkey };
	struct ibv_send_wr w = {
		.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = op,
		.send_flags = signaled ? IBV_SEND_SIGNALED : 0,
		.wr.rdma = { .remote_addr = (uintptr_t)mr->addr, .rkey = rkey },
	}, *bad;
	if (ibv_post_send(qp, &w, &bad))
		die("post_send");
}

static void destroy(struct pair *p)
{
	if (ibv_destroy_qp(p->a) || ibv_destroy_qp(p->b) || ibv_destroy_cq(p->cq_a) ||
	    ibv_destroy_cq(p->cq_b))
		die("destroy pair");
}

static void set_link(const char *iface, const char *how)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "ip link set dev %s %s", iface, how);
	if (system(cmd))
		die(cmd);
}

static struct ibv_qp *destroying;
static volatile int destroyed = -1;

static void *destroy_thread(void *arg)
{
	(void)arg;
	destroyed = ibv_destroy_qp(destroying);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: async_events IFACE");
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("open_device");
	pd = ibv_alloc_pd(ctx);
	char *buf = calloc(1, LEN), *buf2 = calloc(1, LEN);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, LEN, acc);
	if (!pd || !mr || ibv_query_gid(ctx, 1, 0, &gid))
		die("pd/mr/gid");

	/* The fd: non-blocking on request, nothing to read yet. */
	int fl = fcntl(ctx->async_fd, F_GETFL);
	if (fl < 0 || fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK))
		die("async_fd O_NONBLOCK");
	struct ibv_async_event e;
	errno = 0;
	if (ibv_get_async_event(ctx, &e) != -1 || errno != EAGAIN)
		die("get_async_event on an empty non-blocking fd is not EAGAIN");

	/* The link. */
	set_link(argv[1], "down");
	e = expect(IBV_EVENT_PORT_ERR);
	if (e.element.port_num != 1)
		die("PORT_ERR names another port");
	ibv_ack_async_event(&e);
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa) || pa.state == IBV_PORT_ACTIVE)
		die("port still ACTIVE after PORT_ERR");
	set_link(argv[1], "up");
	e = expect(IBV_EVENT_PORT_ACTIVE);
	if (e.element.port_num != 1)
		die("PORT_ACTIVE names another port");
	ibv_ack_async_event(&e);
	if (ibv_query_port(ctx, 1, &pa) || pa.state != IBV_PORT_ACTIVE)
		die("port not ACTIVE after PORT_ACTIVE");

	/* A SEND longer than the receive: the responder's invalid request. */
	struct pair p = connected(NULL, 64);
	post_recv(p.b, NULL, mr, 8);
	post_send(p.a, mr, 64, IBV_WR_SEND, 0, 1);
	if (wait_wc(p.cq_a).status != IBV_WC_REM_INV_REQ_ERR)
		die("requester's status is not REM_INV_REQ_ERR");
	if (wait_wc(p.cq_b).status != IBV_WC_LOC_LEN_ERR)
		die("responder's status is not LOC_LEN_ERR");
	e = expect(IBV_EVENT_QP_REQ_ERR);
	if (e.element.qp != p.b)
		die("QP_REQ_ERR names another QP");
	ibv_ack_async_event(&e);
	destroy(&p);

	/* A WRITE with a bad rkey: the responder's access error. */
	p = connected(NULL, 64);
	post_send(p.a, mr, 64, IBV_WR_RDMA_WRITE, mr->rkey ^ 0x5a5a00, 1);
	if (wait_wc(p.cq_a).status != IBV_WC_REM_ACCESS_ERR)
		die("requester's status is not REM_ACCESS_ERR");
	e = expect(IBV_EVENT_QP_ACCESS_ERR);
	if (e.element.qp != p.b)
		die("QP_ACCESS_ERR names another QP");
	ibv_ack_async_event(&e);
	destroy(&p);

	/* A SEND into a receive whose memory went away: the responder's catastrophe. The event
	 * stays unacknowledged while another thread destroys the QP: destroy must wait. */
	p = connected(NULL, 64);
	struct ibv_mr *gone = ibv_reg_mr(pd, buf2, LEN, acc);
	if (!gone)
		die("reg_mr");
	post_recv(p.b, NULL, gone, LEN);
	if (ibv_dereg_mr(gone))
		die("dereg_mr");
	post_send(p.a, mr, 64, IBV_WR_SEND, 0, 1);
	if (wait_wc(p.cq_b).status != IBV_WC_LOC_PROT_ERR)
		die("responder's status is not LOC_PROT_ERR");
	e = expect(IBV_EVENT_QP_FATAL);
	if (e.element.qp != p.b)
		die("QP_FATAL names another QP");
	pthread_t t;
	destroying = p.b;
	if (pthread_create(&t, NULL, destroy_thread, NULL))
		die("pthread_create");
	usleep(200000);
	if (destroyed != -1)
		die("ibv_destroy_qp returned before the QP's event was acknowledged");
	ibv_ack_async_event(&e);
	pthread_join(t, NULL);
	if (destroyed != 0)
		die("ibv_destroy_qp failed after the acknowledgement");
	printf("destroy waited for the acknowledgement\n");
	while (ibv_poll_cq(p.cq_a, 1, &(struct ibv_wc){ 0 }) > 0)
		;
	if (ibv_destroy_qp(p.a) || ibv_destroy_cq(p.cq_a) || ibv_destroy_cq(p.cq_b))
		die("destroy");

	/* An SRQ armed at 2 with 4 receives: the third SEND takes it below. */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	if (!srq)
		die("create_srq");
	p = connected(srq, 64);
	for (int i = 0; i < 4; i++)
		post_recv(NULL, srq, mr, LEN);
	struct ibv_srq_attr sa = { .srq_limit = 2 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT))
		die("modify_srq limit");
	for (int i = 0; i < 3; i++) {
		post_send(p.a, mr, 64, IBV_WR_SEND, 0, 1);
		if (wait_wc(p.cq_a).status != IBV_WC_SUCCESS || wait_wc(p.cq_b).status != IBV_WC_SUCCESS)
			die("SEND on the SRQ");
	}
	e = expect(IBV_EVENT_SRQ_LIMIT_REACHED);
	if (e.element.srq != srq)
		die("SRQ_LIMIT_REACHED names another SRQ");
	ibv_ack_async_event(&e);
	if (ibv_query_srq(srq, &sa) || sa.srq_limit != 0)
		die("the limit did not disarm");

	/* The SRQ's QP to the error state: its last WQE. */
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	if (ibv_modify_qp(p.b, &err, IBV_QP_STATE))
		die("modify to ERR");
	e = expect(IBV_EVENT_QP_LAST_WQE_REACHED);
	if (e.element.qp != p.b)
		die("QP_LAST_WQE_REACHED names another QP");
	ibv_ack_async_event(&e);
	destroy(&p);
	if (ibv_destroy_srq(srq))
		die("destroy_srq");

	/* A CQ too small for the completions it gets: it overflows. */
	p = connected(NULL, 1);
	int cqe = p.cq_a->cqe;
	for (int i = 0; i <= cqe + 1; i++)
		post_send(p.a, mr, 64, IBV_WR_RDMA_WRITE, mr->rkey, 1);
	e = expect(IBV_EVENT_CQ_ERR);
	if (e.element.cq != p.cq_a)
		die("CQ_ERR names another CQ");
	ibv_ack_async_event(&e);
	destroy(&p);

	errno = 0;
	if (ibv_get_async_event(ctx, &e) != -1 || errno != EAGAIN) {
		fprintf(stderr, "async_events: an event nobody caused: %s\n",
			ibv_event_type_str(e.event_type));
		return 1;
	}
	if (ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("teardown");
	ibv_free_device_list(list);
	printf("async events: every check holds\n");
	return 0;
}
