-- wrk script for the acceptance benchmark: the same request bench/load.ts sends.
wrk.method = "POST"
wrk.body = '{"code":"print(1)"}'
wrk.headers["Content-Type"] = "application/json"
