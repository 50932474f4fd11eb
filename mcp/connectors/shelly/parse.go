package shelly

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Status is the normalised answer the model gets. Pointers are nil when
// the device does not report the value (a plug without a meter has no
// power), so "unknown" is never confused with zero.
type Status struct {
	Device       string   `json:"device"`
	Source       string   `json:"source"` // "cloud" or "local"
	Online       bool     `json:"online"`
	PowerW       *float64 `json:"power_w,omitempty"`
	TemperatureC *float64 `json:"temperature_c,omitempty"`
	WifiRSSI     *float64 `json:"wifi_rssi,omitempty"`
	WifiSSID     string   `json:"wifi_ssid,omitempty"`
	Updated      string   `json:"updated,omitempty"` // cloud: when the cloud last heard from it
	// Raw is the subset of the device's status the numbers came from
	// (switch:N, pm1:N, wifi, sys; Gen1: relays, meters, tmp, wifi_sta).
	Raw map[string]json.RawMessage `json:"status,omitempty"`
}

// CloudError is a Shelly Cloud answer with isok false. Errors maps the
// cloud's error keys (e.g. "wrong_credentials", "device_not_found") to
// its messages.
type CloudError struct{ Errors map[string]string }

func (e *CloudError) Error() string {
	if len(e.Errors) == 0 {
		return "isok is false (no reason given)"
	}
	keys := make([]string, 0, len(e.Errors))
	for k := range e.Errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if v := e.Errors[k]; v != "" && v != k {
			parts = append(parts, k+": "+v)
		} else {
			parts = append(parts, k)
		}
	}
	return strings.Join(parts, "; ")
}

// ParseCloud reads a Shelly Cloud /device/status answer:
// {"isok":true,"data":{"online":true,"device_status":{...}}}.
func ParseCloud(body []byte) (*Status, error) {
	var env struct {
		IsOK   *bool           `json:"isok"`
		Errors json.RawMessage `json:"errors"`
		Data   struct {
			Online       bool                       `json:"online"`
			DeviceStatus map[string]json.RawMessage `json:"device_status"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("decode JSON: %w", err)
	}
	if env.IsOK == nil {
		return nil, errors.New(`answer has no "isok" field`)
	}
	if !*env.IsOK {
		return nil, &CloudError{Errors: cloudErrors(env.Errors)}
	}
	st := fromStatus(env.Data.DeviceStatus)
	st.Online = env.Data.Online
	if u, ok := env.Data.DeviceStatus["_updated"]; ok {
		_ = json.Unmarshal(u, &st.Updated)
	}
	return st, nil
}

// cloudErrors accepts the documented object form and, defensively, an
// array of strings.
func cloudErrors(raw json.RawMessage) map[string]string {
	out := map[string]string{}
	var obj map[string]any
	if json.Unmarshal(raw, &obj) == nil {
		for k, v := range obj {
			s, _ := v.(string)
			out[k] = s
		}
		return out
	}
	var arr []string
	if json.Unmarshal(raw, &arr) == nil {
		for _, k := range arr {
			out[k] = ""
		}
	}
	return out
}

// ParseLocal reads a Gen2 RPC Shelly.GetStatus result (the bare result
// object over HTTP GET, or a JSON-RPC frame with "result").
func ParseLocal(body []byte) (*Status, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("decode JSON: %w", err)
	}
	if r, ok := m["result"]; ok {
		if err := json.Unmarshal(r, &m); err != nil {
			return nil, fmt.Errorf("decode JSON-RPC result: %w", err)
		}
	} else if e, ok := m["error"]; ok {
		var rpcErr struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(e, &rpcErr)
		return nil, fmt.Errorf("RPC error %d: %s", rpcErr.Code, rpcErr.Message)
	}
	if m == nil {
		return nil, errors.New("empty status object")
	}
	st := fromStatus(m)
	st.Online = true // it answered
	return st, nil
}

// fromStatus extracts the normalised numbers from a Gen2 (switch:N,
// pm1:N, wifi) or Gen1 (meters, tmp, wifi_sta) status object.
func fromStatus(m map[string]json.RawMessage) *Status {
	st := &Status{Raw: map[string]json.RawMessage{}}
	var power, temp *float64
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // switch:0 before switch:1, deterministic sums
	for _, k := range keys {
		v := m[k]
		switch {
		case strings.HasPrefix(k, "switch:"), strings.HasPrefix(k, "pm1:"), strings.HasPrefix(k, "cover:"):
			st.Raw[k] = v
			var comp struct {
				APower      *float64 `json:"apower"`
				Temperature struct {
					TC *float64 `json:"tC"`
				} `json:"temperature"`
			}
			if json.Unmarshal(v, &comp) != nil {
				continue
			}
			power = addPtr(power, comp.APower)
			temp = maxPtr(temp, comp.Temperature.TC)
		case k == "wifi" || k == "wifi_sta":
			st.Raw[k] = v
			var w struct {
				RSSI *float64 `json:"rssi"`
				SSID string   `json:"ssid"`
			}
			if json.Unmarshal(v, &w) == nil {
				st.WifiRSSI, st.WifiSSID = w.RSSI, w.SSID
			}
		case k == "sys" || k == "relays":
			st.Raw[k] = v
		case k == "meters":
			st.Raw[k] = v
			var ms []struct {
				Power *float64 `json:"power"`
			}
			if json.Unmarshal(v, &ms) == nil {
				for _, x := range ms {
					power = addPtr(power, x.Power)
				}
			}
		case k == "tmp":
			st.Raw[k] = v
			var t struct {
				TC *float64 `json:"tC"`
			}
			if json.Unmarshal(v, &t) == nil {
				temp = maxPtr(temp, t.TC)
			}
		case k == "temperature:0":
			st.Raw[k] = v
			var t struct {
				TC *float64 `json:"tC"`
			}
			if json.Unmarshal(v, &t) == nil {
				temp = maxPtr(temp, t.TC)
			}
		}
	}
	st.PowerW, st.TemperatureC = power, temp
	return st
}

func addPtr(sum, v *float64) *float64 {
	if v == nil {
		return sum
	}
	if sum == nil {
		x := *v
		return &x
	}
	x := *sum + *v
	return &x
}

// maxPtr keeps the hottest reading: the model asks "is it overheating".
func maxPtr(cur, v *float64) *float64 {
	if v == nil {
		return cur
	}
	if cur == nil || *v > *cur {
		x := *v
		return &x
	}
	return cur
}
