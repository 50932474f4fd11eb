package weather

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// fakeOpenMeteo serves /v1/search and /v1/forecast with the documented
// response shapes (open-meteo.com/en/docs and /en/docs/geocoding-api) and
// fails the test on a request the real API would not get from us.
type fakeOpenMeteo struct {
	errorf   func(format string, args ...any) // t.Errorf
	geo, fc  http.HandlerFunc                 // overrides; nil = the normal answer
	searches atomic.Int32
	lastDays atomic.Int32
}

const berlin = `{"results":[{"id":2950159,"name":"Berlin","latitude":52.52437,"longitude":13.41053,"elevation":74.0,` +
	`"feature_code":"PPLC","country_code":"DE","admin1_id":2950157,"timezone":"Europe/Berlin","population":3426354,` +
	`"postcodes":["10967","13347"],"country_id":2921044,"country":"Germany","admin1":"Land Berlin"}],"generationtime_ms":0.92}`

func (f *fakeOpenMeteo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch r.URL.Path {
	case "/v1/search":
		f.searches.Add(1)
		if q.Get("count") != "1" || q.Get("language") != "en" || q.Get("format") != "json" || q.Get("name") == "" {
			f.errorf("geocoding query %q lacks count=1, language=en, format=json or name", r.URL.RawQuery)
		}
		if f.geo != nil {
			f.geo(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		if q.Get("name") != "Berlin" {
			// The real API omits "results" when nothing matches.
			fmt.Fprint(w, `{"generationtime_ms":0.31}`)
			return
		}
		fmt.Fprint(w, berlin)
	case "/v1/forecast":
		for k, want := range map[string]string{"latitude": "52.52437", "longitude": "13.41053", "timezone": "auto",
			"current": currentVars, "daily": dailyVars} {
			if got := q.Get(k); got != want {
				f.errorf("forecast %s = %q, want %q", k, got, want)
			}
		}
		days, err := strconv.Atoi(q.Get("forecast_days"))
		if err != nil || days < 1 || days > 16 {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":true,"reason":"Forecast days is invalid. Allowed range 0 to 16."}`)
			return
		}
		f.lastDays.Store(int32(days))
		if f.fc != nil {
			f.fc(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprint(w, forecastBody(days))
	default:
		http.NotFound(w, r)
	}
}

func forecastBody(days int) string {
	var dates, tmax, tmin, prec, codes []string
	for i := range days {
		dates = append(dates, strconv.Quote(time.Date(2026, 11, 30+i, 0, 0, 0, 0, time.UTC).Format("2006-01-02")))
		tmax = append(tmax, strconv.FormatFloat(4.5+float64(i), 'f', 1, 64))
		tmin = append(tmin, strconv.FormatFloat(-1.2+float64(i), 'f', 1, 64))
		prec = append(prec, "0.4")
		codes = append(codes, "61")
	}
	codes[0] = "3"
	if days > 1 {
		prec[1] = "null" // Open-Meteo sends null for a missing value
	}
	j := func(s []string) string { return "[" + strings.Join(s, ",") + "]" }
	return `{"latitude":52.52,"longitude":13.419998,"generationtime_ms":0.05,"utc_offset_seconds":3600,` +
		`"timezone":"Europe/Berlin","timezone_abbreviation":"GMT+1","elevation":38.0,` +
		`"current_units":{"time":"iso8601","interval":"seconds","temperature_2m":"°C","relative_humidity_2m":"%","wind_speed_10m":"km/h","weather_code":"wmo code"},` +
		`"current":{"time":"2026-11-30T01:00","interval":900,"temperature_2m":3.1,"relative_humidity_2m":88,"wind_speed_10m":9.4,"weather_code":3},` +
		`"daily_units":{"time":"iso8601","temperature_2m_max":"°C","temperature_2m_min":"°C","precipitation_sum":"mm","weather_code":"wmo code"},` +
		`"daily":{"time":` + j(dates) + `,"temperature_2m_max":` + j(tmax) + `,"temperature_2m_min":` + j(tmin) +
		`,"precipitation_sum":` + j(prec) + `,"weather_code":` + j(codes) + `}}`
}

func node(t *testing.T, s string) yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
		t.Fatal(err)
	}
	return *doc.Content[0]
}

// start serves fake on loopback and builds the tool against it.
func start(t *testing.T, fake *fakeOpenMeteo, extra string) connector.Tool {
	t.Helper()
	fake.errorf = t.Errorf
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	cfg := fmt.Sprintf("geocoding_url: %s\nforecast_url: %s/\n%s", srv.URL, srv.URL, extra)
	tools, err := (&builder{}).Build(connector.Env{Name: "weather", Config: node(t, cfg), HTTP: &http.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(tools) != 1 || tools[0].Def.Name != "weather_forecast" {
		t.Fatalf("tools %+v", tools)
	}
	a := tools[0].Def.Annotations
	if a.ReadOnlyHint == nil || !*a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
		t.Fatalf("annotations %+v", a)
	}
	return tools[0]
}

func TestForecast(t *testing.T) {
	fake := &fakeOpenMeteo{}
	tool := start(t, fake, "")
	for _, days := range []int{1, 3, 7} {
		t.Run(strconv.Itoa(days), func(t *testing.T) {
			args := connector.Args{"city": "  Berlin "}
			if days != defaultDays {
				args["days"] = float64(days)
			}
			out, err := tool.Handler(context.Background(), args)
			if err != nil {
				t.Fatal(err)
			}
			f := out.(Forecast)
			if f.Location.Name != "Berlin" || f.Location.Country != "Germany" || f.Location.Region != "Land Berlin" ||
				f.Location.Latitude != 52.52437 || f.Location.Timezone != "Europe/Berlin" {
				t.Fatalf("location %+v", f.Location)
			}
			if f.Current.Time != "2026-11-30T01:00" || *f.Current.Temperature2m != 3.1 || *f.Current.RelativeHumidity2m != 88 ||
				*f.Current.WindSpeed10m != 9.4 || f.Current.Weather != "overcast" {
				t.Fatalf("current %+v", f.Current)
			}
			if len(f.Daily) != days || int(fake.lastDays.Load()) != days {
				t.Fatalf("got %d days (asked the API for %d), want %d", len(f.Daily), fake.lastDays.Load(), days)
			}
			d0 := f.Daily[0]
			if d0.Date != "2026-11-30" || *d0.Temperature2mMax != 4.5 || *d0.Temperature2mMin != -1.2 || *d0.PrecipitationSum != 0.4 {
				t.Fatalf("day 0 %+v", d0)
			}
			if days > 1 && (f.Daily[1].PrecipitationSum != nil || f.Daily[1].Weather != "slight rain") {
				t.Fatalf("day 1 %+v: want null precipitation kept as null", f.Daily[1])
			}
			if f.Units["temperature_2m"] != "°C" || f.Units["precipitation_sum"] != "mm" || f.Units["interval"] != "" {
				t.Fatalf("units %v", f.Units)
			}
			if _, err := json.Marshal(f); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestForecastErrors(t *testing.T) {
	html := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<html><body>Service temporarily unavailable</body></html>")
	}
	status500 := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream broke", http.StatusInternalServerError)
	}
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	tests := []struct {
		name     string
		geo, fc  http.HandlerFunc
		args     connector.Args
		want     string
		noSearch bool // rejected before any request
	}{
		{name: "unknown city", args: connector.Args{"city": "Xyzzyville"}, want: `Open-Meteo knows no place named "Xyzzyville"`},
		{name: "geocoding 500", geo: status500, args: connector.Args{"city": "Berlin"}, want: "Open-Meteo geocoding answered HTTP 500 Internal Server Error; try again later"},
		{name: "forecast 500", fc: status500, args: connector.Args{"city": "Berlin"}, want: "Open-Meteo forecast answered HTTP 500"},
		{name: "geocoding html", geo: html, args: connector.Args{"city": "Berlin"}, want: `answered with "text/html; charset=utf-8" instead of JSON`},
		{name: "forecast html", fc: html, args: connector.Args{"city": "Berlin"}, want: "Open-Meteo forecast answered with \"text/html"},
		{name: "geocoding timeout", geo: hang, args: connector.Args{"city": "Berlin"}, want: "Open-Meteo geocoding did not answer within 200ms"},
		{name: "forecast timeout", fc: hang, args: connector.Args{"city": "Berlin"}, want: "Open-Meteo forecast did not answer within 200ms"},
		{name: "api error body", fc: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":true,"reason":"Latitude must be in range of -90 to 90°. Given: 91.0."}`)
		}, args: connector.Args{"city": "Berlin"}, want: "Open-Meteo forecast rejected the request (HTTP 400): Latitude must be in range"},
		{name: "broken json", fc: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"latitude":52.5,`)
		}, args: connector.Args{"city": "Berlin"}, want: "answered with JSON that does not parse"},
		{name: "ragged daily", fc: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"daily":{"time":["2026-11-30","2026-12-01"],"temperature_2m_max":[1],"temperature_2m_min":[1,2],"precipitation_sum":[0,0]}}`)
		}, args: connector.Args{"city": "Berlin"}, want: "without a usable daily series"},
		{name: "too big", geo: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"results":[],"pad":"`+strings.Repeat("x", maxBody)+`"}`)
		}, args: connector.Args{"city": "Berlin"}, want: "more than 1048576 bytes"},
		{name: "empty city", args: connector.Args{"city": "  "}, want: "too short", noSearch: true},
		{name: "missing city", args: connector.Args{}, want: "too short", noSearch: true},
		{name: "long city", args: connector.Args{"city": strings.Repeat("a", 101)}, want: "at most 100", noSearch: true},
		{name: "control char", args: connector.Args{"city": "Ber\nlin"}, want: "control character", noSearch: true},
		{name: "days 0", args: connector.Args{"city": "Berlin", "days": 0.0}, want: "whole number from 1 to 7", noSearch: true},
		{name: "days 8", args: connector.Args{"city": "Berlin", "days": 8.0}, want: "whole number from 1 to 7", noSearch: true},
		{name: "days 2.5", args: connector.Args{"city": "Berlin", "days": 2.5}, want: "whole number from 1 to 7", noSearch: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := &fakeOpenMeteo{geo: tt.geo, fc: tt.fc}
			// Only the hanging cases need a short timeout; the others must
			// not depend on how fast a loaded machine moves 1 MiB.
			timeout := "timeout: 30s\n"
			if strings.Contains(tt.want, "did not answer") {
				timeout = "timeout: 200ms\n"
			}
			tool := start(t, fake, timeout)
			out, err := tool.Handler(context.Background(), tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("result %+v, err = %v; want an error containing %q", out, err, tt.want)
			}
			if tt.noSearch != (fake.searches.Load() == 0) {
				t.Fatalf("geocoding called %d times; want none only for bad arguments", fake.searches.Load())
			}
			if strings.Contains(tt.want, "did not answer") && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("timeout error %v does not wrap context.DeadlineExceeded", err)
			}
		})
	}
}

func TestUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	tools, err := (&builder{}).Build(connector.Env{Name: "weather", Config: node(t, "geocoding_url: "+url+"\n")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = tools[0].Handler(context.Background(), connector.Args{"city": "Berlin"})
	if err == nil || !strings.Contains(err.Error(), "Open-Meteo geocoding is not reachable; try again later") || strings.Contains(err.Error(), url) {
		t.Fatalf("err = %v", err)
	}
}

func TestBuildConfig(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"defaults", "", ""},
		{"custom", "geocoding_url: http://127.0.0.1:8081/om\nforecast_url: https://meteo.example.org\ntimeout: 3s\n", ""},
		{"unknown key", "api_key: x\n", "api_key"},
		{"bad scheme", "forecast_url: ftp://example.org\n", "mcp.connectors.weather.forecast_url"},
		{"no host", "geocoding_url: /v1\n", "mcp.connectors.weather.geocoding_url"},
		{"query", "forecast_url: https://api.open-meteo.com/?apikey=1\n", "without query"},
		{"credentials", "forecast_url: https://u:p@api.open-meteo.com\n", "credentials"},
		{"zero timeout", "timeout: 0s\n", "timeout 0s"},
		{"bad timeout", "timeout: forever\n", "mcp.connectors.weather"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := connector.Env{Name: "weather"}
			if tt.yaml != "" {
				env.Config = node(t, tt.yaml)
			}
			_, err := (&builder{}).Build(env)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Build: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Build: err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestSchemaAndDefaults(t *testing.T) {
	tools, err := (&builder{}).Build(connector.Env{Name: "weather"})
	if err != nil || len(tools) != 1 {
		t.Fatalf("Build: %v", err)
	}
	s := tools[0].Def.InputSchema
	if len(s.Required) != 1 || s.Required[0] != "city" {
		t.Fatalf("required %v", s.Required)
	}
	days := s.Properties["days"].(map[string]any)
	if fmt.Sprint(days["minimum"], days["maximum"]) != "1 7" {
		t.Fatalf("days schema %v", days)
	}
	for _, u := range []string{DefaultGeocodingURL, DefaultForecastURL} {
		if got, err := baseURL("weather", "x", u+"/"); err != nil || got != u {
			t.Fatalf("baseURL(%s/) = %q, %v", u, got, err)
		}
	}
}

// FuzzForecastResponse feeds arbitrary forecast bodies through the whole
// tool: whatever the API sends, the handler returns a result or an error
// and never panics.
func FuzzForecastResponse(f *testing.F) {
	f.Add(forecastBody(3))
	f.Add(`{"daily":{"time":["a"],"temperature_2m_max":[1],"temperature_2m_min":[null],"precipitation_sum":[0],"weather_code":[]}}`)
	f.Add(`{"error":true,"reason":"x"}`)
	f.Add(`{"current":{"weather_code":1.5}}`)
	f.Add(`[]`)
	var body atomic.Value
	fake := &fakeOpenMeteo{fc: func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body.Load().(string))
	}}
	fake.errorf = func(string, ...any) {} // queries are checked by TestForecast
	srv := httptest.NewServer(fake)
	defer srv.Close()
	cfg := fmt.Sprintf("geocoding_url: %s\nforecast_url: %s\ntimeout: 5s\n", srv.URL, srv.URL)
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(cfg), &doc); err != nil {
		f.Fatal(err)
	}
	tools, err := (&builder{}).Build(connector.Env{Name: "weather", Config: *doc.Content[0]})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		body.Store(s)
		out, err := tools[0].Handler(context.Background(), connector.Args{"city": "Berlin"})
		if err == nil {
			if _, ok := out.(Forecast); !ok {
				t.Fatalf("result %T", out)
			}
		}
	})
}
