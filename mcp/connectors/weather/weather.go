package weather

import (
	"context"
	"fmt"
	"gpuhost/mcp/connector"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

func init() { connector.Register("weather", func() connector.Connector { return &builder{} }) }

// Defaults: Open-Meteo's public endpoints and a timeout that leaves the
// model an answer well before a client gives up on the call.
const (
	DefaultGeocodingURL = "https://geocoding-api.open-meteo.com"
	DefaultForecastURL  = "https://api.open-meteo.com"
	DefaultTimeout      = 10 * time.Second
	defaultDays         = 3
	maxDays             = 7
	maxCityLen          = 100
)

// config is the weather section of mcp.connectors.
type config struct {
	// GeocodingURL and ForecastURL are the API bases (scheme and host, no
	// path), configurable for a self-hosted Open-Meteo or a test server.
	GeocodingURL string `yaml:"geocoding_url"`
	ForecastURL  string `yaml:"forecast_url"`
	// Timeout bounds each of the two HTTP calls.
	Timeout time.Duration `yaml:"timeout"`
}

type builder struct{}

// Build returns weather_forecast.
func (c *builder) Build(env connector.Env) ([]connector.Tool, error) {
	cfg := config{GeocodingURL: DefaultGeocodingURL, ForecastURL: DefaultForecastURL, Timeout: DefaultTimeout}
	if err := connector.DecodeConfig(env, &cfg); err != nil {
		return nil, err
	}
	geo, err := baseURL(env.Name, "geocoding_url", cfg.GeocodingURL)
	if err != nil {
		return nil, err
	}
	fc, err := baseURL(env.Name, "forecast_url", cfg.ForecastURL)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 || cfg.Timeout > 2*time.Minute {
		return nil, fmt.Errorf("mcp.connectors.%s.timeout %v: want more than 0 and at most 2m", env.Name, cfg.Timeout)
	}
	hc := env.HTTP
	if hc == nil {
		hc = &http.Client{}
	}
	cl := &client{http: hc, geocodingURL: geo, forecastURL: fc, timeout: cfg.Timeout}
	def := mcpgo.NewTool("weather_forecast",
		mcpgo.WithDescription("Current weather and a daily forecast (1-7 days) for a city, from Open-Meteo: temperature, humidity, wind, "+
			"weather description, daily min/max temperature and precipitation, in the place's local time. "+
			"The city is looked up by name; the answer names the place that was found so you can check it is the one meant."),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithOpenWorldHintAnnotation(true),
		mcpgo.WithSchemaAdditionalProperties(false),
		mcpgo.WithString("city", mcpgo.Required(), mcpgo.MinLength(2), mcpgo.MaxLength(maxCityLen),
			mcpgo.Description("City or place name, e.g. \"Berlin\" or \"Springfield\" (no country suffix needed)")),
		mcpgo.WithInteger("days", mcpgo.Min(1), mcpgo.Max(maxDays), mcpgo.DefaultNumber(defaultDays),
			mcpgo.Description("Number of forecast days including today (1-7, default 3)")),
	)
	return []connector.Tool{{Def: def, Handler: cl.handle}}, nil
}

// baseURL accepts only an http(s) scheme and host (optionally a path
// prefix), so the tool's request paths are always ours.
func baseURL(section, key, raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("mcp.connectors.%s.%s %q: %w", section, key, raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("mcp.connectors.%s.%s %q: want an http(s) base URL such as %s, without query, fragment or credentials",
			section, key, raw, DefaultForecastURL)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Forecast is weather_forecast's result: only what Open-Meteo returned,
// reshaped per day, plus the WMO weather code's standard description.
type Forecast struct {
	Location Location `json:"location"`
	Current  Current  `json:"current"`
	Daily    []Day    `json:"daily"`
	// Units maps each value's field name to Open-Meteo's unit ("°C", "km/h", …).
	Units  map[string]string `json:"units"`
	Source string            `json:"source"`
}

// Location is the geocoding match the forecast is for.
type Location struct {
	Name        string  `json:"name"`
	Region      string  `json:"region,omitempty"`
	Country     string  `json:"country,omitempty"`
	CountryCode string  `json:"country_code,omitempty"`
	Latitude    float64 `json:"latitude"`
	Longitude   float64 `json:"longitude"`
	ElevationM  float64 `json:"elevation_m"`
	Timezone    string  `json:"timezone,omitempty"`
}

// Current is the weather now (local time of the place).
type Current struct {
	Time               string   `json:"time"`
	Temperature2m      *float64 `json:"temperature_2m"`
	RelativeHumidity2m *float64 `json:"relative_humidity_2m"`
	WindSpeed10m       *float64 `json:"wind_speed_10m"`
	WeatherCode        *int     `json:"weather_code"`
	Weather            string   `json:"weather,omitempty"`
}

// Day is one day of the forecast.
type Day struct {
	Date             string   `json:"date"`
	Temperature2mMax *float64 `json:"temperature_2m_max"`
	Temperature2mMin *float64 `json:"temperature_2m_min"`
	PrecipitationSum *float64 `json:"precipitation_sum"`
	WeatherCode      *int     `json:"weather_code,omitempty"`
	Weather          string   `json:"weather,omitempty"`
}

func (c *client) handle(ctx context.Context, args connector.Args) (any, error) {
	city, err := checkCity(args.String("city"))
	if err != nil {
		return nil, err
	}
	days := defaultDays
	if n, ok := args.Number("days"); ok {
		if n < 1 || n > maxDays || n != float64(int(n)) {
			return nil, fmt.Errorf("days %v: want a whole number from 1 to %d", n, maxDays)
		}
		days = int(n)
	}
	p, err := c.geocode(ctx, city)
	if err != nil {
		return nil, err
	}
	f, err := c.forecast(ctx, p, days)
	if err != nil {
		return nil, err
	}
	out := Forecast{
		Location: Location{Name: p.Name, Region: p.Admin1, Country: p.Country, CountryCode: p.CountryCode,
			Latitude: p.Latitude, Longitude: p.Longitude, ElevationM: p.Elevation, Timezone: f.Timezone},
		Current: Current{Time: f.Current.Time, Temperature2m: f.Current.Temperature2m, RelativeHumidity2m: f.Current.RelativeHumidity2m,
			WindSpeed10m: f.Current.WindSpeed10m, WeatherCode: f.Current.WeatherCode, Weather: describe(f.Current.WeatherCode)},
		Daily:  make([]Day, 0, len(f.Daily.Time)),
		Units:  map[string]string{},
		Source: "Open-Meteo (open-meteo.com), CC BY 4.0",
	}
	if out.Location.Timezone == "" {
		out.Location.Timezone = p.Timezone
	}
	for i, date := range f.Daily.Time {
		d := Day{Date: date, Temperature2mMax: f.Daily.Temperature2mMax[i], Temperature2mMin: f.Daily.Temperature2mMin[i],
			PrecipitationSum: f.Daily.PrecipitationSum[i]}
		if f.Daily.WeatherCode != nil {
			d.WeatherCode = f.Daily.WeatherCode[i]
			d.Weather = describe(d.WeatherCode)
		}
		out.Daily = append(out.Daily, d)
	}
	for k, v := range f.CurrentUnits {
		if k != "time" && k != "interval" {
			out.Units[k] = v
		}
	}
	for k, v := range f.DailyUnits {
		if k != "time" {
			out.Units[k] = v
		}
	}
	return out, nil
}

// checkCity is the only free text a tool here takes: it is sent to the
// geocoder as a query parameter (escaped) and never anywhere else, so the
// checks are about giving the model a clear answer, not about safety.
func checkCity(raw string) (string, error) {
	city := strings.TrimSpace(raw)
	n := utf8.RuneCountInString(city)
	switch {
	case !utf8.ValidString(city):
		return "", fmt.Errorf("city is not valid UTF-8 text")
	case n < 2:
		return "", fmt.Errorf("city %q is too short: give a place name of at least 2 characters", city)
	case n > maxCityLen:
		return "", fmt.Errorf("city is %d characters long; give just the place name (at most %d)", n, maxCityLen)
	}
	for _, r := range city {
		if unicode.IsControl(r) {
			return "", fmt.Errorf("city contains a control character (%U); give just the place name", r)
		}
	}
	return city, nil
}

// wmo is the WMO weather interpretation code table Open-Meteo documents
// for weather_code.
var wmo = map[int]string{
	0: "clear sky", 1: "mainly clear", 2: "partly cloudy", 3: "overcast",
	45: "fog", 48: "depositing rime fog",
	51: "light drizzle", 53: "moderate drizzle", 55: "dense drizzle",
	56: "light freezing drizzle", 57: "dense freezing drizzle",
	61: "slight rain", 63: "moderate rain", 65: "heavy rain",
	66: "light freezing rain", 67: "heavy freezing rain",
	71: "slight snow fall", 73: "moderate snow fall", 75: "heavy snow fall", 77: "snow grains",
	80: "slight rain showers", 81: "moderate rain showers", 82: "violent rain showers",
	85: "slight snow showers", 86: "heavy snow showers",
	95: "thunderstorm", 96: "thunderstorm with slight hail", 99: "thunderstorm with heavy hail",
}

func describe(code *int) string {
	if code == nil {
		return ""
	}
	return wmo[*code]
}
