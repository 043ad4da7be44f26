# A training step of an SD-shaped UNet (diffusers' UNet2DConditionModel, small channels):
# convolutions, group norms, cross-attention, under bf16 autocast, three AdamW steps.
import torch
from diffusers import UNet2DConditionModel

unet = UNet2DConditionModel(
    sample_size=32, in_channels=4, out_channels=4, layers_per_block=1,
    block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=64,
    attention_head_dim=8, norm_num_groups=8,
).to("cuda")
unet.train()
opt = torch.optim.AdamW(unet.parameters(), lr=1e-4)
latents = torch.zeros(2, 4, 32, 32, device="cuda")
text = torch.zeros(2, 16, 64, device="cuda")
t = torch.zeros(2, dtype=torch.long, device="cuda")
for step in range(3):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        pred = unet(latents, t, encoder_hidden_states=text).sample
        loss = torch.nn.functional.mse_loss(pred.float(), latents)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
