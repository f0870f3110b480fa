/* The DPDK calls ferroce makes, as plain functions: bindgen reads this header (with the
 * system's DPDK headers) to generate the bindings, and shim.c gives the static inline ones a
 * body Rust can link against. */
#include <stdint.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_flow.h>
#include <rte_memory.h>
#include <rte_dev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* Brings port `port` up with `nq` rx and `nq` tx queues of the given depths, rx queue i taking
 * receive buffers from `pools[i]`. With several queues, receive-side scaling over addresses
 * and UDP ports, as far as the PMD offers them (a PMD without RSS, such as memif, pairs queue
 * i with the peer's queue i). Returns 0 or a negative errno. */
int fr_port_start_queues(uint16_t port, struct rte_mempool **pools, uint16_t nq,
                         uint16_t rx_desc, uint16_t tx_desc, int multi_seg);
/* Puts the port in flow-isolated mode, before it is configured: only what flow rules send to
 * DPDK arrives, the rest stays with the kernel (a bifurcated NIC such as mlx5). Returns 0 or a
 * negative errno, with the PMD's reason in `msg` (`cap` bytes, NUL-terminated). */
int fr_port_isolate(uint16_t port, char *msg, uint32_t cap);
/* Installs two ingress rules on a started port, eth / ipv4 / udp dst `udp_dst` and the same
 * over ipv6, each spreading matches over queues 0..nq-1 by RSS on addresses and UDP ports
 * (queue 0 alone when nq is 1). Returns 0 or a negative errno with the reason in `msg`. */
int fr_port_steer_udp(uint16_t port, uint16_t nq, uint16_t udp_dst, char *msg, uint32_t cap);
/* Makes `len` bytes at `addr` (both multiples of `page_sz`) known to DPDK as external memory
 * and maps them for DMA by the port's device with IOVA = VA, so the PMD can send mbufs
 * attached to them. A device that needs no mapping (its bus or driver has none) is fine.
 * Returns 0 or a negative errno. */
int fr_port_map_memory(uint16_t port, void *addr, size_t len, size_t page_sz);
/* Undoes fr_port_map_memory for the same range. Returns 0 or a negative errno. */
int fr_port_unmap_memory(uint16_t port, void *addr, size_t len);
/* 1 when `addr` lies in memory registered as external, 0 when not. */
int fr_mem_is_external(const void *addr);
/* Registers the calling thread with EAL (an lcore id, mempool caches), or unregisters it.
 * Returns 0 or a negative errno. */
int fr_thread_register(void);
void fr_thread_unregister(void);
/* The calling thread's lcore id, or -1 when it has none. */
int fr_lcore_id(void);
/* The most rx/tx queue pairs the port offers, or a negative errno. */
int fr_port_max_queues(uint16_t port);
/* 1 when the port's PMD can transmit chained mbufs, 0 when not, negative on error. */
int fr_port_multi_seg(uint16_t port);

uint16_t fr_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t fr_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
struct rte_mbuf *fr_pktmbuf_alloc(struct rte_mempool *pool);
void fr_pktmbuf_free(struct rte_mbuf *m);
/* Appends `len` bytes to an empty mbuf and returns where they start, or NULL. */
uint8_t *fr_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
/* The first segment's data and its length. */
const uint8_t *fr_mbuf_data(const struct rte_mbuf *m, uint16_t *len);
/* The whole packet's bytes, contiguous: in place when it has one segment, else copied into
 * `scratch` (which holds `cap` bytes; NULL when the packet is longer). */
const uint8_t *fr_mbuf_linear(const struct rte_mbuf *m, uint8_t *scratch, uint32_t cap,
                              uint32_t *len);
/* A shared-info block for external buffers that outlive every mbuf attached to them (the
 * free callback does nothing); its reference count starts at 1 and never drops to 0 while
 * attachments come and go. NULL when out of memory. */
struct rte_mbuf_ext_shared_info *fr_shinfo_new(void);
/* Chains `len` bytes at `addr` (memory outside DPDK's pools) after `head` as an external
 * buffer attached to an mbuf from `pool`: no copy. Returns 0, or -1 when no mbuf is free. */
int fr_chain_extbuf(struct rte_mbuf *head, struct rte_mempool *pool, void *addr, uint16_t len,
                    struct rte_mbuf_ext_shared_info *shinfo);
/* Chains a copy of `len` bytes after `head` in an mbuf from `pool`. Returns 0 or -1. */
int fr_chain_copy(struct rte_mbuf *head, struct rte_mempool *pool, const void *data,
                  uint16_t len);
