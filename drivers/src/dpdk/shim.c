#include "shim.h"

int fr_port_start(uint16_t port, struct rte_mempool *pool, uint16_t rx_desc, uint16_t tx_desc)
{
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof(conf));
    int rc = rte_eth_dev_configure(port, 1, 1, &conf);
    if (rc < 0)
        return rc;
    /* Jumbo frames where the PMD allows them (RoCEv2 at 4 KiB path MTU needs ~4.2 KB);
     * a PMD that refuses keeps its MTU, which the port reports. */
    (void)rte_eth_dev_set_mtu(port, 9000);
    int socket = rte_eth_dev_socket_id(port);
    if (socket < 0)
        socket = 0;
    rc = rte_eth_rx_queue_setup(port, 0, rx_desc, (unsigned)socket, NULL, pool);
    if (rc < 0)
        return rc;
    rc = rte_eth_tx_queue_setup(port, 0, tx_desc, (unsigned)socket, NULL);
    if (rc < 0)
        return rc;
    rc = rte_eth_dev_start(port);
    if (rc < 0)
        return rc;
    rte_eth_promiscuous_enable(port);
    return 0;
}

uint16_t fr_rx_burst(uint16_t port, struct rte_mbuf **pkts, uint16_t n)
{
    return rte_eth_rx_burst(port, 0, pkts, n);
}

uint16_t fr_tx_burst(uint16_t port, struct rte_mbuf **pkts, uint16_t n)
{
    return rte_eth_tx_burst(port, 0, pkts, n);
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
