/* SEND_WITH_IMM and WRITE_WITH_IMM through a libibverbs, checked at the receiver: the
 * immediate (in network order, as the verbs API carries it), the completion opcode and
 * length, and the bytes. None of rdma-core's examples or perftest's tests post these, so
 * scripts/ibverbs-test.sh builds this against rdma-core's header and runs it over ferroce's
 * library like the others.
 *   imm                 server: waits on TCP port 18517
 *   imm SERVER-ADDRESS  client: sends a SEND_WITH_IMM and a WRITE_WITH_IMM
 * Exit status 0 when every check holds on this side. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PORT 18517
#define LEN 4096
#define SEND_LEN 512
#define WRITE_LEN 256
#define WRITE_OFF 1024
#define SEND_IMM 0x11223344u
#define WRITE_IMM 0x55667788u

struct dest {
	uint32_t qpn, psn, rkey;
	uint64_t addr;
	union ibv_gid gid;
};

static void die(const char *what)
{
	fprintf(stderr, "imm: %s\n", what);
	exit(1);
}

static int tcp(const char *server)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	if (fd < 0)
		die("socket");
	if (server) {
		if (inet_pton(AF_INET, server, &a.sin_addr) != 1)
			die("bad server address");
		for (int i = 0; connect(fd, (struct sockaddr *)&a, sizeof a); i++) {
			if (i == 100)
				die("cannot connect");
			usleep(50000);
		}
		return fd;
	}
	int one = 1, c;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 1))
		die("bind/listen");
	c = accept(fd, NULL, NULL);
	close(fd);
	if (c < 0)
		die("accept");
	return c;
}

static void xfer(int fd, void *out, void *in, size_t n)
{
	if (write(fd, out, n) != (ssize_t)n)
		die("exchange write");
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, (char *)in + got, n - got);
		if (r <= 0)
			die("exchange read");
		got += r;
	}
}

static struct ibv_wc wait_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0)
		die("poll_cq");
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "imm: completion %llu: %s\n", (unsigned long long)wc.wr_id,
			ibv_wc_status_str(wc.status));
		exit(1);
	}
	return wc;
}

int main(int argc, char **argv)
{
	const char *server = argc > 1 ? argv[1] : NULL;
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(1, LEN);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !mr || !cq)
		die("pd/mr/cq");
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	if (!qp)
		die("create_qp");
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	struct dest me = { .qpn = qp->qp_num, .psn = server ? 0x1234 : 0xabcdef,
			   .rkey = mr->rkey, .addr = (uintptr_t)buf }, peer;
	if (ibv_query_gid(ctx, 1, 0, &me.gid))
		die("query_gid");
	if (!server) {
		/* Receives first: the client may send as soon as the exchange ends. */
		for (int i = 0; i < 2; i++) {
			struct ibv_sge s = { (uintptr_t)buf, LEN, mr->lkey };
			struct ibv_recv_wr w = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;
			if (ibv_post_recv(qp, &w, &bad))
				die("post_recv");
		}
	}
	int fd = tcp(server);
	xfer(fd, &me, &peer, sizeof me);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer.qpn;
	a.rq_psn = peer.psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer.gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = me.psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
	char go = 1;
	xfer(fd, &go, &go, 1); /* both sides ready */

	if (server) {
		for (int i = 0; i < LEN; i++)
			buf[i] = (char)(i * 7 + 3);
		struct ibv_sge s1 = { (uintptr_t)buf, SEND_LEN, mr->lkey };
		struct ibv_sge s2 = { (uintptr_t)buf + WRITE_OFF, WRITE_LEN, mr->lkey };
		struct ibv_send_wr w2 = {
			.wr_id = 2, .sg_list = &s2, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
			.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(WRITE_IMM),
			.wr.rdma = { .remote_addr = peer.addr + WRITE_OFF, .rkey = peer.rkey },
		};
		struct ibv_send_wr w1 = {
			.wr_id = 1, .next = &w2, .sg_list = &s1, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
			.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(SEND_IMM),
		}, *bad;
		if (ibv_post_send(qp, &w1, &bad))
			die("post_send");
		struct ibv_wc c1 = wait_one(cq), c2 = wait_one(cq);
		if (c1.wr_id != 1 || c1.opcode != IBV_WC_SEND || c2.wr_id != 2 ||
		    c2.opcode != IBV_WC_RDMA_WRITE)
			die("send completions out of order or mislabelled");
	} else {
		struct ibv_wc c1 = wait_one(cq), c2 = wait_one(cq);
		if (c1.opcode != IBV_WC_RECV || !(c1.wc_flags & IBV_WC_WITH_IMM) ||
		    ntohl(c1.imm_data) != SEND_IMM || c1.byte_len != SEND_LEN || c1.wr_id != 100) {
			fprintf(stderr, "imm: SEND_WITH_IMM arrived as opcode %d flags %#x imm %#x len %u\n",
				c1.opcode, c1.wc_flags, ntohl(c1.imm_data), c1.byte_len);
			return 1;
		}
		if (c2.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(c2.wc_flags & IBV_WC_WITH_IMM) ||
		    ntohl(c2.imm_data) != WRITE_IMM || c2.wr_id != 101) {
			fprintf(stderr, "imm: WRITE_WITH_IMM arrived as opcode %d flags %#x imm %#x\n",
				c2.opcode, c2.wc_flags, ntohl(c2.imm_data));
			return 1;
		}
		for (int i = 0; i < SEND_LEN; i++)
			if (buf[i] != (char)(i * 7 + 3))
				die("SEND payload differs");
		for (int i = WRITE_OFF; i < WRITE_OFF + WRITE_LEN; i++)
			if (buf[i] != (char)(i * 7 + 3))
				die("WRITE payload differs");
	}
	xfer(fd, &go, &go, 1); /* neither tears down before the other is done */
	printf("imm: %s ok (SEND_WITH_IMM %#x, WRITE_WITH_IMM %#x)\n", server ? "sender" : "receiver",
	       SEND_IMM, WRITE_IMM);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	close(fd);
	return 0;
}
