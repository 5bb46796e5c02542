//! The kernel-UDP backend: a UDP socket per worker (one SO_REUSEPORT group on the memcache
//! UDP address) driven through the worker's io_uring ring.
