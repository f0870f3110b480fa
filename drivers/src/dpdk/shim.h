/* The DPDK calls ferroce makes, as plain functions: bindgen reads this header (with the
 * system's DPDK headers) to generate the bindings, and shim.c gives the static inline ones a
 * body Rust can link against. */
#include <stdint.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* Brings port `port` up with one rx and one tx queue of the given depths, taking receive
 * buffers from `pool`. Returns 0 or a negative errno. */
int fr_port_start(uint16_t port, struct rte_mempool *pool, uint16_t rx_desc, uint16_t tx_desc);

uint16_t fr_rx_burst(uint16_t port, struct rte_mbuf **pkts, uint16_t n);
uint16_t fr_tx_burst(uint16_t port, struct rte_mbuf **pkts, uint16_t n);
struct rte_mbuf *fr_pktmbuf_alloc(struct rte_mempool *pool);
void fr_pktmbuf_free(struct rte_mbuf *m);
/* Appends `len` bytes to an empty mbuf and returns where they start, or NULL. */
uint8_t *fr_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
/* The first segment's data and its length. */
const uint8_t *fr_mbuf_data(const struct rte_mbuf *m, uint16_t *len);
