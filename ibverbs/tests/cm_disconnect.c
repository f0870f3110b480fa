/* A connection through librdmacm that the peer ends while work is outstanding, as on a
 * ConnectX: the side left behind gets RDMA_CM_EVENT_DISCONNECTED and its posted receive
 * completes flushed (IBV_WC_WR_FLUSH_ERR). Both ends are ids of this process on one device,
 * connected through the port's own address. Also: a REQ to a port nobody listens on is
 * REJECTED with reason 8 (invalid service ID); a second listener on a port is EADDRINUSE;
 * multicast joins fail with EOPNOTSUPP and rsockets with ENOSYS. And a peer process that
 * exits with its connection open: its library ends the connection on the wire as the kernel
 * does when a process's file closes, so this side gets DISCONNECTED (within 10 s, where an
 * idle QP would otherwise never learn) and its receive flushes, while a child forked from
 * this process ends none of its parent's connections when it exits. scripts/rdmacm-test.sh
 * builds this against rdma-core's headers and runs it over ferroce's libraries.
 *   cm_disconnect IP
 * Exit status 0 when every check holds. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
	fprintf(stderr, "cm_disconnect: %s (errno %d)\n", what, errno);
	exit(1);
}

static struct rdma_event_channel *ch;

static void within(int ms, const char *what);

/* The next event but TIMEWAIT_EXIT (which ends a closed connection's time wait, about 2 s
 * after it), within 10 s; it must be `want`. Returns its id (and listen id). */
static struct rdma_cm_id *expect(enum rdma_cm_event_type want, int status,
				 struct rdma_cm_id **listen)
{
	struct rdma_cm_event *e;
	for (;;) {
		within(10000, rdma_event_str(want));
		if (rdma_get_cm_event(ch, &e))
			die("rdma_get_cm_event");
		if (e->event != RDMA_CM_EVENT_TIMEWAIT_EXIT)
			break;
		rdma_ack_cm_event(e);
	}
	if (e->event != want || e->status != status) {
		fprintf(stderr, "cm_disconnect: got %s status %d, wanted %s status %d\n",
			rdma_event_str(e->event), e->status, rdma_event_str(want), status);
		exit(1);
	}
	struct rdma_cm_id *id = e->id;
	if (listen)
		*listen = e->listen_id;
	rdma_ack_cm_event(e);
	return id;
}

/* Waits up to `ms` for the channel's next event. */
static void within(int ms, const char *what)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	int n = poll(&pfd, 1, ms);
	if (n < 0)
		die("poll");
	if (n == 0) {
		fprintf(stderr, "cm_disconnect: no event in %d ms, waiting for %s\n", ms, what);
		exit(1);
	}
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(id, NULL, &a))
		die("rdma_create_qp");
}

static void post_recv(struct rdma_cm_id *id, void *buf, struct ibv_mr *mr, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(id->qp, &wr, &bad))
		die("ibv_post_recv");
}

/* The one completion the id's receive CQ holds: a flushed receive with `wr_id`. */
static void expect_flush(struct rdma_cm_id *id, uint64_t wr_id)
{
	struct ibv_wc wc;
	for (int i = 0; i < 2000000; i++) {
		int n = ibv_poll_cq(id->recv_cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1) {
			if (wc.status != IBV_WC_WR_FLUSH_ERR || wc.wr_id != wr_id) {
				fprintf(stderr, "cm_disconnect: completion %s wr_id %llu\n",
					ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
				exit(1);
			}
			return;
		}
	}
	die("the outstanding receive did not complete");
}

/* The peer process: connects to `addr` and exits with the connection open. */
static int exit_connected(struct sockaddr_in *addr)
{
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)addr, 2000))
		die("resolve (peer process)");
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL);
	if (rdma_resolve_route(id, 2000))
		die("route (peer process)");
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL);
	make_qp(id);
	struct rdma_conn_param p = { .retry_count = 7, .rnr_retry_count = 7 };
	if (rdma_connect(id, &p))
		die("rdma_connect (peer process)");
	expect(RDMA_CM_EVENT_ESTABLISHED, 0, NULL);
	exit(0);
}

int main(int argc, char **argv)
{
	if (argc != 2 && !(argc == 3 && strcmp(argv[2], "exit-connected") == 0))
		die("usage: cm_disconnect IP");
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(7999) };
	if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1)
		die("bad IP");
	ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel");
	if (argc == 3)
		return exit_connected(&addr);

	struct rdma_cm_id *listener, *second, *client, *server, *lid, *nobody;
	if (rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listener, (struct sockaddr *)&addr) || rdma_listen(listener, 4))
		die("listen");
	if (rdma_create_id(ch, &second, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(second, (struct sockaddr *)&addr) == 0 || errno != EADDRINUSE)
		die("a second id could bind the listener's port");
	if (rdma_join_multicast(listener, (struct sockaddr *)&addr, NULL) == 0 ||
	    errno != EOPNOTSUPP)
		die("rdma_join_multicast did not fail with EOPNOTSUPP");
	if (rsocket(AF_INET, SOCK_STREAM, 0) != -1 || errno != ENOSYS)
		die("rsocket did not fail with ENOSYS");

	/* A port nobody listens on: REJECTED, reason 8. */
	struct sockaddr_in none = addr;
	none.sin_port = htons(7998);
	if (rdma_create_id(ch, &nobody, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(nobody, NULL, (struct sockaddr *)&none, 2000))
		die("resolve (nobody)");
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL);
	if (rdma_resolve_route(nobody, 2000))
		die("route (nobody)");
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL);
	make_qp(nobody);
	struct rdma_conn_param p = { .retry_count = 7, .rnr_retry_count = 7 };
	if (rdma_connect(nobody, &p))
		die("rdma_connect (nobody)");
	if (expect(RDMA_CM_EVENT_REJECTED, 8, NULL) != nobody)
		die("the REJECTED event is for another id");

	/* The connection. */
	if (rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(client, NULL, (struct sockaddr *)&addr, 2000))
		die("resolve");
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL);
	if (rdma_resolve_route(client, 2000))
		die("route");
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL);
	make_qp(client);
	static char cbuf[64], sbuf[64];
	struct ibv_mr *cmr = ibv_reg_mr(client->pd, cbuf, sizeof cbuf, IBV_ACCESS_LOCAL_WRITE);
	if (!cmr)
		die("ibv_reg_mr");
	post_recv(client, cbuf, cmr, 41);
	if (rdma_connect(client, &p))
		die("rdma_connect");
	server = expect(RDMA_CM_EVENT_CONNECT_REQUEST, 0, &lid);
	if (lid != listener)
		die("the request names another listener");
	make_qp(server);
	struct ibv_mr *smr = ibv_reg_mr(server->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE);
	if (!smr)
		die("ibv_reg_mr");
	post_recv(server, sbuf, smr, 42);
	if (rdma_accept(server, NULL))
		die("rdma_accept");
	int established = 0;
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_id *id = expect(RDMA_CM_EVENT_ESTABLISHED, 0, NULL);
		established |= id == client ? 1 : id == server ? 2 : 4;
	}
	if (established != 3)
		die("ESTABLISHED is not once for each side");

	/* A child forked from this process leaves with exit(): its copy of the library ends
	 * nothing (the connections stay this process's), and its exit does not hang. */
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0)
		exit(0);
	int kst;
	if (waitpid(kid, &kst, 0) != kid || !WIFEXITED(kst) || WEXITSTATUS(kst) != 0)
		die("a forked child's exit failed");
	struct pollfd quiet = { .fd = ch->fd, .events = POLLIN };
	if (poll(&quiet, 1, 300) != 0)
		die("a forked child's exit touched this process's connections");

	/* The server ends the connection with the client's receive outstanding. */
	if (rdma_disconnect(server))
		die("rdma_disconnect");
	int disconnected = 0;
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_id *id = expect(RDMA_CM_EVENT_DISCONNECTED, 0, NULL);
		disconnected |= id == client ? 1 : id == server ? 2 : 4;
	}
	if (disconnected != 3)
		die("DISCONNECTED is not once for each side");
	expect_flush(client, 41);
	expect_flush(server, 42);

	/* A peer process that exits with the connection open. */
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		execl("/proc/self/exe", argv[0], argv[1], "exit-connected", (char *)NULL);
		_exit(127);
	}
	struct rdma_cm_id *orphan = expect(RDMA_CM_EVENT_CONNECT_REQUEST, 0, NULL);
	make_qp(orphan);
	post_recv(orphan, sbuf, smr, 43);
	if (rdma_accept(orphan, NULL))
		die("rdma_accept (peer process)");
	if (expect(RDMA_CM_EVENT_ESTABLISHED, 0, NULL) != orphan)
		die("ESTABLISHED for another id");
	int status;
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		die("the peer process failed");
	if (expect(RDMA_CM_EVENT_DISCONNECTED, 0, NULL) != orphan)
		die("DISCONNECTED for another id");
	expect_flush(orphan, 43);
	rdma_destroy_qp(orphan);
	if (rdma_destroy_id(orphan))
		die("rdma_destroy_id");

	ibv_dereg_mr(cmr);
	ibv_dereg_mr(smr);
	rdma_destroy_qp(client);
	rdma_destroy_qp(server);
	rdma_destroy_qp(nobody);
	if (rdma_destroy_id(client) || rdma_destroy_id(server) || rdma_destroy_id(nobody) ||
	    rdma_destroy_id(second) || rdma_destroy_id(listener))
		die("rdma_destroy_id");
	rdma_destroy_event_channel(ch);
	printf("cm_disconnect: REJ 8 for a port nobody listens on; EADDRINUSE; EOPNOTSUPP and "
	       "ENOSYS; a disconnect with receives outstanding gives DISCONNECTED on both sides "
	       "and flushes them; so does a peer process that exits with its connection open\n");
	return 0;
}
