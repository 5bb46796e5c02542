//! memcache text and meta protocol: request parsing and reply formatting.
