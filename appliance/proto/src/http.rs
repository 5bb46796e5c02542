//! HTTP/1.1 object API: request-head parsing with bounded inputs, response formatting.
