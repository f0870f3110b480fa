#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <infiniband/sa-kern-abi.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_cma.h>
