// Package nas is the storage connector for Synology DSM: read-only tools
// for a configured NAS's shared folders (nas_shares), its CPU, memory and
// network load (nas_utilization) and its volumes (nas_volumes).
//
// The client logs in once through SYNO.API.Auth (format=sid), keeps the
// session id and shares it across concurrent calls; when DSM answers a
// session error (106 timed out, 107 interrupted by a duplicate login, 119
// SID not found) it logs in again by itself and retries the call once.
// Every request is a POST with a form body, so neither the password nor
// the sid ever appears in a URL (and so in no transport error or proxy
// log). The password is read from the named environment variable at login
// time, never stored in config.
//
// DSM APIs used (all documented, all reads):
//
//   - SYNO.API.Auth v6 login
//   - SYNO.FileStation.List v2 list_share (additional=volume_status)
//   - SYNO.Core.System.Utilization v1 get
//   - SYNO.Storage.CGI.Storage v1 load_info (needs an administrator account)
//
// Config section in gpuhost.yaml:
//
//	mcp:
//	  connectors:
//	    nas:
//	      timeout: 15s                 # per call; optional, default 15s
//	      nas:
//	        - name: backup-nas
//	          url: https://nas.lan:5001
//	          user: gpuhost-ro           # a dedicated read-only DSM account
//	          password_env: NAS_BACKUP_PASSWORD
//	          insecure_tls: true         # DSM's self-signed certificate
//
// Accounts with 2-step verification cannot log in without an OTP; use a
// dedicated account without it (DSM error 403 says so).
package nas
