// Package shelly is the home-automation connector: one read-only tool,
// shelly_get_device_status, that reports a configured Shelly device's
// power, temperature, Wi-Fi signal and online state, either through the
// Shelly Cloud API (`POST {server}/device/status` with id and auth_key) or
// straight from the device's local Gen2 RPC (`GET {address}/rpc/Shelly.GetStatus`).
//
// The model picks a device by its configured name (an enum); addresses,
// cloud servers and device ids come only from the config, and the cloud
// auth key is read from the named environment variable at call time.
//
// Config section in gpuhost.yaml:
//
//	mcp:
//	  connectors:
//	    shelly:
//	      timeout: 10s               # per call; optional, default 10s
//	      devices:
//	        - name: server-rack-plug
//	          mode: cloud
//	          id: a8032abe41fc                         # Device -> Settings -> Device info
//	          server: https://shelly-42-eu.shelly.cloud # "Server URI" next to the auth key
//	          auth_key_env: SHELLY_CLOUD_AUTH_KEY
//	        - name: gpu-box-plug
//	          mode: local
//	          address: http://192.168.1.50             # Gen2 device, auth disabled
//
// Local devices must have authentication disabled: digest auth
// (password_env) is not implemented yet, and a config that sets it is
// refused rather than silently calling without it. Gen1 devices work
// through the cloud (their meters/tmp/wifi_sta fields are read too).
package shelly
