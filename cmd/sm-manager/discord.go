package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
)

// discordGateway asks Discord's GET /gateway/bot when a bot token is
// configured. total_shards = "auto" takes its recommendation (and fails the
// start without an answer); otherwise a failed answer only leaves the budget
// unknown. The returned fetch asks again, for each DEPLOY.
func discordGateway(cfg *config.Config, log *slog.Logger) (*discord.GatewayBot, func(context.Context) (discord.GatewayBot, error), error) {
	if !cfg.Discord.HasToken() {
		return nil, nil, nil
	}
	token, err := discord.LoadToken(cfg.Discord.TokenFile, cfg.Discord.TokenEnv)
	if err != nil {
		return nil, nil, fmt.Errorf("discord token: %w", err)
	}
	client := &discord.GatewayClient{BaseURL: cfg.Discord.APIBaseURL, Token: token}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gw, err := client.GatewayBot(ctx)
	switch {
	case err != nil && cfg.Topology.Auto:
		return nil, nil, fmt.Errorf(`total_shards = "auto": %w`, err)
	case err != nil:
		log.Warn("GET /gateway/bot failed; the session-start budget is unknown until a DEPLOY asks again", "err", err)
		return nil, client.GatewayBot, nil
	}
	log.Info("Discord gateway", "recommended_shards", gw.TotalShards(), "max_concurrency", gw.SessionStartLimit.MaxConcurrency,
		"session_starts_remaining", gw.SessionStartLimit.Remaining, "of", gw.SessionStartLimit.Total)
	if cfg.Topology.Auto {
		cfg.Topology.TotalShards = gw.TotalShards()
	} else if gw.TotalShards() != cfg.Topology.TotalShards {
		log.Info("Discord recommends another shard count than the config's", "recommended", gw.TotalShards(), "configured", cfg.Topology.TotalShards)
	}
	return &gw, client.GatewayBot, nil
}
