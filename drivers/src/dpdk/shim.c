#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <errno.h>
#include <rte_errno.h>

#include "shim.h"

int fr_port_multi_seg(uint16_t port)
{
    struct rte_eth_dev_info info;
    int rc = rte_eth_dev_info_get(port, &info);
    if (rc < 0)
        return rc;
    return (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
}

static int fr_flow_fail(int rc, const struct rte_flow_error *err, char *msg, uint32_t cap)
{
    if (cap > 0) {
        const char *why = err->message ? err->message : rte_strerror(-rc);
        snprintf(msg, cap, "%s", why);
    }
    return rc < 0 ? rc : -EINVAL;
}

int fr_port_isolate(uint16_t port, char *msg, uint32_t cap)
{
    struct rte_flow_error err;
    memset(&err, 0, sizeof(err));
    int rc = rte_flow_isolate(port, 1, &err);
    return rc == 0 ? 0 : fr_flow_fail(rc, &err, msg, cap);
}

int fr_port_steer_udp(uint16_t port, uint16_t nq, uint16_t udp_dst, char *msg, uint32_t cap)
{
    uint16_t queues[RTE_MAX_QUEUES_PER_PORT];
    if (nq == 0 || nq > RTE_MAX_QUEUES_PER_PORT)
        return fr_flow_fail(-EINVAL, &(struct rte_flow_error){0}, msg, cap);
    for (uint16_t q = 0; q < nq; q++)
        queues[q] = q;
    struct rte_flow_attr attr = {.ingress = 1};
    struct rte_flow_item_udp udp = {.hdr.dst_port = rte_cpu_to_be_16(udp_dst)};
    struct rte_flow_item_udp udp_mask = {.hdr.dst_port = RTE_BE16(0xffff)};
    struct rte_flow_action_queue one = {.index = 0};
    struct rte_flow_action_rss rss = {
        .func = RTE_ETH_HASH_FUNCTION_DEFAULT,
        .level = 0,
        .types = RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP,
        .key_len = 0,
        .key = NULL,
        .queue_num = nq,
        .queue = queues,
    };
    struct rte_flow_action actions[] = {
        nq == 1 ? (struct rte_flow_action){.type = RTE_FLOW_ACTION_TYPE_QUEUE, .conf = &one}
                : (struct rte_flow_action){.type = RTE_FLOW_ACTION_TYPE_RSS, .conf = &rss},
        {.type = RTE_FLOW_ACTION_TYPE_END},
    };
    enum rte_flow_item_type l3[] = {RTE_FLOW_ITEM_TYPE_IPV4, RTE_FLOW_ITEM_TYPE_IPV6};
    for (int i = 0; i < 2; i++) {
        struct rte_flow_item pattern[] = {
            {.type = RTE_FLOW_ITEM_TYPE_ETH},
            {.type = l3[i]},
            {.type = RTE_FLOW_ITEM_TYPE_UDP, .spec = &udp, .mask = &udp_mask},
            {.type = RTE_FLOW_ITEM_TYPE_END},
        };
        struct rte_flow_error err;
        memset(&err, 0, sizeof(err));
        int rc = rte_flow_validate(port, &attr, pattern, actions, &err);
        if (rc != 0)
            return fr_flow_fail(rc, &err, msg, cap);
        if (rte_flow_create(port, &attr, pattern, actions, &err) == NULL)
            return fr_flow_fail(-rte_errno, &err, msg, cap);
    }
    return 0;
}

static struct rte_device *fr_port_device(uint16_t port)
{
    struct rte_eth_dev_info info;
    if (rte_eth_dev_info_get(port, &info) < 0)
        return NULL;
    return info.device;
}

int fr_port_map_memory(uint16_t port, void *addr, size_t len, size_t page_sz)
{
    struct rte_device *dev = fr_port_device(port);
    if (dev == NULL)
        return -ENODEV;
    if (rte_extmem_register(addr, len, NULL, 0, page_sz) < 0)
        return -rte_errno;
    int rc = rte_dev_dma_map(dev, addr, (uint64_t)(uintptr_t)addr, len);
    if (rc < 0 && rte_errno != ENOTSUP) {
        int err = rte_errno ? -rte_errno : rc;
        (void)rte_extmem_unregister(addr, len);
        return err;
    }
    return 0;
}

int fr_port_unmap_memory(uint16_t port, void *addr, size_t len)
{
    struct rte_device *dev = fr_port_device(port);
    if (dev != NULL)
        (void)rte_dev_dma_unmap(dev, addr, (uint64_t)(uintptr_t)addr, len);
    if (rte_extmem_unregister(addr, len) < 0)
        return -rte_errno;
    return 0;
}

int fr_mem_is_external(const void *addr)
{
    struct rte_memseg_list *msl = rte_mem_virt2memseg_list(addr);
    return msl != NULL && msl->external;
}

int fr_thread_register(void)
{
    return rte_thread_register() == 0 ? 0 : -rte_errno;
}

void fr_thread_unregister(void)
{
    rte_thread_unregister();
}

int fr_lcore_id(void)
{
    unsigned id = rte_lcore_id();
    return id == LCORE_ID_ANY ? -1 : (int)id;
}

int fr_port_max_queues(uint16_t port)
{
    struct rte_eth_dev_info info;
    int rc = rte_eth_dev_info_get(port, &info);
    if (rc < 0)
        return rc;
    return info.max_rx_queues < info.max_tx_queues ? info.max_rx_queues : info.max_tx_queues;
}

int fr_port_start_queues(uint16_t port, struct rte_mempool **pools, uint16_t nq,
                         uint16_t rx_desc, uint16_t tx_desc, int multi_seg)
{
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof(conf));
    if (multi_seg)
        conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
    struct rte_eth_dev_info info;
    int rc = rte_eth_dev_info_get(port, &info);
    if (rc < 0)
        return rc;
    uint64_t rss = info.flow_type_rss_offloads & (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP);
    if (nq > 1 && rss != 0) {
        conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
        conf.rx_adv_conf.rss_conf.rss_hf = rss;
    }
    rc = rte_eth_dev_configure(port, nq, nq, &conf);
    if (rc < 0)
        return rc;
    /* Jumbo frames where the PMD allows them (RoCEv2 at 4 KiB path MTU needs ~4.2 KB);
     * a PMD that refuses keeps its MTU, which the port reports. */
    uint32_t mtu = info.max_mtu < 9000 ? info.max_mtu : 9000;
    uint32_t by_frame = info.max_rx_pktlen > 18 ? info.max_rx_pktlen - 18 : 0;
    if (by_frame < mtu)
        mtu = by_frame;
    uint16_t cur = 0;
    if (rte_eth_dev_get_mtu(port, &cur) == 0 && mtu > cur)
        (void)rte_eth_dev_set_mtu(port, (uint16_t)mtu);
    int socket = rte_eth_dev_socket_id(port);
    if (socket < 0)
        socket = 0;
    for (uint16_t q = 0; q < nq; q++) {
        rc = rte_eth_rx_queue_setup(port, q, rx_desc, (unsigned)socket, NULL, pools[q]);
        if (rc < 0)
            return rc;
        rc = rte_eth_tx_queue_setup(port, q, tx_desc, (unsigned)socket, NULL);
        if (rc < 0)
            return rc;
    }
    rc = rte_eth_dev_start(port);
    if (rc < 0)
        return rc;
    rte_eth_promiscuous_enable(port);
    return 0;
}

uint16_t fr_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
    return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t fr_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
    return rte_eth_tx_burst(port, queue, pkts, n);
}

struct rte_mbuf *fr_pktmbuf_alloc(struct rte_mempool *pool)
{
    return rte_pktmbuf_alloc(pool);
}

void fr_pktmbuf_free(struct rte_mbuf *m)
{
    rte_pktmbuf_free(m);
}

uint8_t *fr_pktmbuf_append(struct rte_mbuf *m, uint16_t len)
{
    return (uint8_t *)rte_pktmbuf_append(m, len);
}

const uint8_t *fr_mbuf_data(const struct rte_mbuf *m, uint16_t *len)
{
    *len = rte_pktmbuf_data_len(m);
    return rte_pktmbuf_mtod(m, const uint8_t *);
}

const uint8_t *fr_mbuf_linear(const struct rte_mbuf *m, uint8_t *scratch, uint32_t cap,
                              uint32_t *len)
{
    *len = rte_pktmbuf_pkt_len(m);
    if (m->nb_segs == 1)
        return rte_pktmbuf_mtod(m, const uint8_t *);
    if (*len > cap)
        return NULL;
    return (const uint8_t *)rte_pktmbuf_read(m, 0, *len, scratch);
}

static void fr_extbuf_keep(void *addr, void *opaque)
{
    (void)addr;
    (void)opaque;
}

struct rte_mbuf_ext_shared_info *fr_shinfo_new(void)
{
    struct rte_mbuf_ext_shared_info *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->free_cb = fr_extbuf_keep;
    s->fcb_opaque = NULL;
    rte_mbuf_ext_refcnt_set(s, 1);
    return s;
}

int fr_chain_extbuf(struct rte_mbuf *head, struct rte_mempool *pool, void *addr, uint16_t len,
                    struct rte_mbuf_ext_shared_info *shinfo)
{
    struct rte_mbuf *m = rte_pktmbuf_alloc(pool);
    if (m == NULL)
        return -1;
    /* Software PMDs never use the IOVA; mlx5 translates virtual addresses through its own
     * memory-region cache. In IOVA-as-VA mode the address is the IOVA. */
    rte_iova_t iova = rte_eal_iova_mode() == RTE_IOVA_VA ? (rte_iova_t)(uintptr_t)addr : RTE_BAD_IOVA;
    rte_mbuf_ext_refcnt_update(shinfo, 1);
    rte_pktmbuf_attach_extbuf(m, addr, iova, len, shinfo);
    m->data_len = len;
    m->pkt_len = len;
    if (rte_pktmbuf_chain(head, m) != 0) {
        rte_pktmbuf_free(m);
        return -1;
    }
    return 0;
}

int fr_chain_copy(struct rte_mbuf *head, struct rte_mempool *pool, const void *data,
                  uint16_t len)
{
    struct rte_mbuf *m = rte_pktmbuf_alloc(pool);
    if (m == NULL)
        return -1;
    char *dst = rte_pktmbuf_append(m, len);
    if (dst == NULL || rte_pktmbuf_chain(head, m) != 0) {
        rte_pktmbuf_free(m);
        return -1;
    }
    memcpy(dst, data, len);
    return 0;
}
